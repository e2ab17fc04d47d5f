"""The timeline's `[spill]` lane: the agents' moves between host memory and their disk tier.

Case matrix:

| input | checked |
|---|---|
| SPILL_DONE and FILL_DONE events (proto JSON, node in `detail`) | one `[spill]` interval each, `time - seconds` to `time`, named `spill job` / `fill job`, with bytes, node and rate |
| a spill and a fill that overlap (two nodes at once) | the second goes to `[spill] #2`; the lane order puts both after `[moves]` |
| the same log as a Chrome trace | a `[spill]` thread holding the intervals, in microseconds from the first event |
| the same log for the PNG | the plotter gets `spill` and `fill` bars on the `[spill]` lanes |
| no tier events | no `[spill]` lane |
"""

from __future__ import annotations

from rlslice.apps.timeline.trace_export import (
    MOVES_LANE,
    SPILL_LANE,
    SWITCH_LANE,
    build_timeline,
    chrome_trace,
    events_from_json,
    plot_lanes,
)

MiB = 1 << 20


def _log() -> list[dict[str, object]]:
    def event(time: float, kind: str, job: str = "", **extra: object) -> dict[str, object]:
        return {"time": time, "group": "g", "kind": f"EVENT_KIND_{kind}", "job": job, **extra}

    return [
        event(100.0, "GRANTED", "a", epoch="1"),
        event(101.0, "QUEUED", "b", detail="train"),
        event(101.5, "SPILL_DONE", "c", seconds=0.25, bytes=str(8 * MiB), detail="n1"),
        event(102.0, "FILL_DONE", "b", seconds=0.5, bytes=str(8 * MiB), detail="n1"),
        event(102.25, "FILL_DONE", "b", seconds=0.5, bytes=str(4 * MiB), detail="n2"),
        event(103.0, "YIELDED", "a"),
        event(103.0, "SWITCH_STARTED", "b", epoch="2"),
        event(103.5, "SNAPSHOT_DONE", "a", epoch="2", seconds=0.5, bytes="10", detail="n1"),
        event(104.0, "SWITCH_DONE", "b", epoch="2", seconds=1.0),
        event(104.0, "GRANTED", "b", epoch="2"),
    ]


def test_spill_and_fill_events_become_intervals_of_the_spill_lane() -> None:
    timeline = build_timeline(events_from_json(_log()))
    spills = sorted(
        (i for i in timeline.intervals if i.lane.startswith(SPILL_LANE)), key=lambda i: i.start
    )
    assert [(i.lane, i.name, i.category, i.start, i.end) for i in spills] == [
        (SPILL_LANE, "spill c", "spill", 101.25, 101.5),
        (SPILL_LANE, "fill b", "fill", 101.5, 102.0),
        (f"{SPILL_LANE} #2", "fill b", "fill", 101.75, 102.25),
    ]
    first_fill = spills[1]
    assert first_fill.args["bytes"] == 8 * MiB
    assert first_fill.args["node"] == "n1"
    assert first_fill.args["gb_per_s"] == round(8 * MiB / 0.5 / 1e9, 3)


def test_the_spill_lane_comes_after_the_moves_lane_and_before_the_jobs() -> None:
    timeline = build_timeline(events_from_json(_log()))
    assert timeline.lanes == (SWITCH_LANE, MOVES_LANE, SPILL_LANE, f"{SPILL_LANE} #2", "a", "b")


def test_the_chrome_trace_has_a_spill_thread_with_its_intervals() -> None:
    trace = chrome_trace(build_timeline(events_from_json(_log())))
    names = {
        e["args"]["name"]: e["tid"] for e in trace["traceEvents"] if e.get("name") == "thread_name"
    }
    spans = [
        e for e in trace["traceEvents"] if e.get("ph") == "X" and e["tid"] == names[SPILL_LANE]
    ]
    assert [(e["name"], e["ts"], e["dur"]) for e in spans] == [
        ("spill c", 1_250_000, 250_000),
        ("fill b", 1_500_000, 500_000),
    ]


def test_the_png_draws_spill_and_fill_bars_on_the_spill_lane() -> None:
    lanes, _ = plot_lanes(build_timeline(events_from_json(_log())))
    assert [(lane, kind) for lane, _, _, kind in lanes if lane.startswith(SPILL_LANE)] == [
        (SPILL_LANE, "spill"),
        (SPILL_LANE, "fill"),
        (f"{SPILL_LANE} #2", "fill"),
    ]


def test_a_log_without_tier_moves_has_no_spill_lane() -> None:
    events = [
        e for e in _log() if e["kind"] not in ("EVENT_KIND_SPILL_DONE", "EVENT_KIND_FILL_DONE")
    ]
    timeline = build_timeline(events_from_json(events))
    assert not any(lane.startswith(SPILL_LANE) for lane in timeline.lanes)
