"""Events -> timeline lanes -> Chrome trace, against a recorded event log and random logs.

Case matrix:

| input | checked |
|---|---|
| the recorded log (fixtures/events.json) | every interval (lane, name, category, start, end) and instant, exactly; lane order; another group's events left out; busy seconds |
| the recorded log as a Chrome trace | traceEvents shape, thread names per lane, microseconds from the first event, args |
| proto JSON vs short kind names, int64 as strings | same events |
| a SWITCH_DONE whose start fell out of the ring | starts at `time - seconds` |
| an interval open at the end | ends at the last event, marked open |
| an empty log | an empty timeline and a trace with only the process name |
| not a list / not objects | ValueError naming the place |
| the recorded log for the PNG | planner plotter lanes: gpu:<phase>, wait, moves, failed switches, switch markers |
| random logs (hypothesis) | no two intervals of a lane overlap; no two jobs hold at once; intervals within the log; event_to_dict round-trips (parts too) |
| a partial switch (issue 26): the status after it lists the outgoing job's parked and discarded tags | the switch slice, the snapshot slice and an instant on the job's lane name them (`parked p3; discarded p0`, args `parked_parts`/`discarded_parts`), in the trace too |
| a whole switch | no parts named anywhere; the slices as before |
| a switch that parks two jobs partly; an earlier partly parked job still listed | each outgoing job named, tags prefixed by job; the earlier job not named |
| parts in proto JSON (camelCase) and field names | the same parts |
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlslice.apps.timeline.trace_export import (
    MOVES_LANE,
    SWITCH_LANE,
    Event,
    JobParts,
    build_timeline,
    busy_seconds,
    chrome_trace,
    event_from_dict,
    event_to_dict,
    events_from_json,
    plot_lanes,
)

FIXTURE = Path(__file__).parent / "fixtures" / "events.json"
T0 = 1_700_000_000.0


def recorded() -> list[Event]:
    return events_from_json(json.loads(FIXTURE.read_text()))


def us(seconds: float) -> int:
    """Microseconds from the log's first event."""
    return round(seconds * 1_000_000)


def test_the_recorded_log_gives_exactly_these_intervals() -> None:
    timeline = build_timeline(recorded(), "g1")
    got = sorted(
        (i.lane, i.name, i.category, us(i.start - T0), us(i.end - T0)) for i in timeline.intervals
    )
    expected = sorted(
        [
            ("actor-a", "rollout", "held", us(0.1), us(1.1)),
            ("actor-b", "waiting", "waiting", us(0.5), us(1.6)),
            (SWITCH_LANE, "switch -> actor-b", "switch", us(1.1), us(1.6)),
            (MOVES_LANE, "snapshot actor-a", "snapshot", us(1.15), us(1.35)),
            (MOVES_LANE, "restore actor-b", "restore", us(1.35), us(1.6)),
            ("actor-b", "train", "held", us(1.6), us(3.0)),
            ("actor-a", "waiting", "waiting", us(1.7), us(3.5)),
            (SWITCH_LANE, "switch -> actor-a", "switch", us(3.0), us(3.5)),
            (MOVES_LANE, "snapshot actor-b", "snapshot", us(3.0), us(3.3)),
            (f"{MOVES_LANE} #2", "snapshot actor-b", "snapshot", us(3.03), us(3.28)),
            (MOVES_LANE, "restore actor-a", "restore", us(3.3), us(3.5)),
            ("actor-a", "rollout", "held", us(3.5), us(4.0)),
            ("actor-b", "waiting", "waiting", us(3.6), us(4.9)),
            (SWITCH_LANE, "switch -> actor-b", "switch", us(4.0), us(4.9)),
            (MOVES_LANE, "snapshot actor-a", "snapshot", us(4.0), us(4.2)),
            ("actor-a", "waiting", "waiting", us(5.0), us(5.2)),
            (SWITCH_LANE, "switch -> actor-a", "switch", us(5.0), us(5.2)),
            (MOVES_LANE, "restore actor-a", "restore", us(5.0), us(5.2)),
            ("actor-a", "rollout", "held", us(5.2), us(6.0)),
        ]
    )
    assert got == expected


def test_the_recorded_log_gives_these_instants_and_lane_order() -> None:
    timeline = build_timeline(recorded(), "g1")
    got = [(i.lane, i.name, us(i.time - T0)) for i in timeline.instants]
    assert got == [
        ("actor-a", "yielded", us(1.1)),
        ("actor-b", "yield_requested", us(2.6)),
        ("actor-b", "preempted", us(3.0)),
        ("actor-a", "yielded", us(4.0)),
        ("actor-b", "switch_failed", us(4.9)),
        ("actor-b", "faulted", us(4.9)),
    ]
    assert timeline.lanes == (SWITCH_LANE, MOVES_LANE, f"{MOVES_LANE} #2", "actor-a", "actor-b")
    assert (timeline.start, timeline.end) == (T0, T0 + 6.0)


def test_intervals_say_how_they_ended_and_what_moved() -> None:
    timeline = build_timeline(recorded(), "g1")
    by_key = {(i.lane, us(i.start - T0)): i for i in timeline.intervals}
    assert by_key[("actor-b", us(1.6))].args["ended_by"] == "PREEMPTED"
    assert by_key[("actor-b", us(3.6))].args["ended_by"] == "FAULTED"
    assert by_key[("actor-a", us(5.2))].args["ended_by"] == "open"
    failed = by_key[(SWITCH_LANE, us(4.0))]
    assert failed.args["outcome"] == "failed"
    done = by_key[(SWITCH_LANE, us(1.1))]
    assert done.args == {
        "seconds": 0.5,
        "bytes": 4_000_000_000,
        "epoch": 1,
        "gb_per_s": 8.0,
        "outcome": "done",
    }
    assert by_key[(f"{MOVES_LANE} #2", us(3.03))].args["node"] == "node-2"


def test_another_groups_events_are_left_out() -> None:
    timeline = build_timeline(recorded(), "g1")
    assert "x" not in timeline.lanes
    other = build_timeline(recorded(), "other")
    assert other.lanes == ("x",)
    assert [i.args["ended_by"] for i in other.intervals] == ["open"]


def test_busy_seconds_add_up_the_held_intervals() -> None:
    busy = busy_seconds(build_timeline(recorded(), "g1"))
    assert busy == pytest.approx({"actor-a": 1.0 + 0.5 + 0.8, "actor-b": 1.4})


def test_the_chrome_trace_has_one_thread_per_lane_and_microsecond_times() -> None:
    timeline = build_timeline(recorded(), "g1")
    trace = chrome_trace(timeline)
    assert json.loads(json.dumps(trace)) == trace  # plain JSON all the way down
    events = trace["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert [names[t] for t in sorted(names)] == list(timeline.lanes)
    assert [e["args"]["name"] for e in events if e["name"] == "process_name"] == ["g1"]
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == len(timeline.intervals) == 19
    first_hold = next(e for e in complete if e["name"] == "rollout")
    assert first_hold["ts"] == 100_000
    assert first_hold["dur"] == 1_000_000
    assert names[first_hold["tid"]] == "actor-a"
    assert first_hold["cat"] == "held"
    instants = [e for e in events if e["ph"] == "i"]
    assert {e["s"] for e in instants} == {"t"}
    assert len(instants) == 6
    assert all(isinstance(e["ts"], int) and e["ts"] >= 0 for e in complete + instants)
    assert trace["otherData"] == {"group": "g1", "start_unix": T0, "end_unix": T0 + 6.0}


def test_proto_json_and_short_kind_names_read_the_same() -> None:
    long = {"time": 1.5, "group": "g", "kind": "EVENT_KIND_GRANTED", "job": "a", "epoch": "3"}
    short = {"time": 1.5, "group": "g", "kind": "GRANTED", "job": "a", "epoch": 3}
    assert event_from_dict(long) == event_from_dict(short)
    assert event_from_dict(long) == Event(time=1.5, group="g", kind="GRANTED", job="a", epoch=3)
    assert events_from_json([long]) == events_from_json({"events": [short]})


def test_a_switch_whose_start_fell_out_of_the_ring_starts_at_time_minus_seconds() -> None:
    events = [
        Event(time=10.0, group="g", kind="YIELDED", job="a"),
        Event(time=12.0, group="g", kind="SWITCH_DONE", job="b", seconds=0.5, bytes=10),
        Event(time=12.0, group="g", kind="GRANTED", job="b", epoch=2),
    ]
    (switch,) = [i for i in build_timeline(events).intervals if i.category == "switch"]
    assert (switch.start, switch.end, switch.name) == (11.5, 12.0, "switch -> b")


def test_an_empty_log_gives_an_empty_timeline() -> None:
    timeline = build_timeline([], "g")
    assert (timeline.lanes, timeline.intervals, timeline.instants) == ((), (), ())
    assert [e["name"] for e in chrome_trace(timeline)["traceEvents"]] == ["process_name"]


@pytest.mark.parametrize(
    ("document", "fragment"),
    [({"events": 3}, "events: expected a list"), ([1], "events[0]: expected an object")],
)
def test_malformed_logs_are_refused_naming_the_place(document: Any, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        events_from_json(document)


KINDS = [
    "REGISTERED",
    "QUEUED",
    "GRANTED",
    "YIELDED",
    "CANCELLED",
    "LEASE_EXPIRED",
    "SWITCH_STARTED",
    "SWITCH_DONE",
    "SWITCH_FAILED",
    "SNAPSHOT_DONE",
    "RESTORE_DONE",
    "FAULTED",
    "PREEMPTED",
    "UNREGISTERED",
    "GROUP_DELETED",
]

event_lists = st.lists(
    st.builds(
        Event,
        time=st.floats(0, 100, allow_nan=False),
        group=st.just("g"),
        kind=st.sampled_from(KINDS),
        job=st.sampled_from(["", "a", "b", "c", "switch"]),
        epoch=st.integers(0, 50),
        seconds=st.floats(0, 5, allow_nan=False),
        bytes=st.integers(0, 10**12),
        detail=st.sampled_from(["", "rollout", "train", "node-1"]),
        seq=st.integers(0, 10**6),
        parts=st.lists(
            st.builds(
                JobParts,
                job=st.sampled_from(["a", "b", "c"]),
                parked=st.lists(st.sampled_from(["p0", "p3"]), max_size=2).map(tuple),
                discarded=st.lists(st.sampled_from(["p1", "kv"]), min_size=1, max_size=2).map(
                    tuple
                ),
            ),
            max_size=2,
        ).map(tuple),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(event_lists)
def test_no_lane_ever_holds_two_overlapping_intervals(events: list[Event]) -> None:
    timeline = build_timeline(events, "g")
    by_lane: dict[str, list[tuple[float, float]]] = {}
    for interval in timeline.intervals:
        assert timeline.start <= interval.start <= interval.end <= timeline.end
        assert interval.lane in timeline.lanes
        by_lane.setdefault(interval.lane, []).append((interval.start, interval.end))
    for spans in by_lane.values():
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start >= end
    assert {i.lane for i in timeline.instants} <= set(timeline.lanes)


@settings(max_examples=200, deadline=None)
@given(event_lists)
def test_no_two_jobs_are_ever_drawn_holding_at_once(events: list[Event]) -> None:
    held = sorted(
        (i.start, i.end) for i in build_timeline(events, "g").intervals if i.category == "held"
    )
    for (_, end), (start, _) in itertools.pairwise(held):
        assert start >= end


@given(event_lists)
def test_events_round_trip_through_their_json_form(events: list[Event]) -> None:
    document = json.loads(json.dumps({"events": [event_to_dict(e) for e in events]}))
    assert events_from_json(document) == events


def test_an_uncontended_acquire_draws_no_wait() -> None:
    events = [
        Event(time=1.0, group="g", kind="QUEUED", job="a", detail="rollout"),
        Event(time=1.0, group="g", kind="GRANTED", job="a", epoch=1, detail="rollout"),
        Event(time=2.0, group="g", kind="YIELDED", job="a", seconds=1.0),
    ]
    intervals = build_timeline(events).intervals
    assert [(i.category, i.name, i.start, i.end) for i in intervals] == [
        ("held", "rollout", 1.0, 2.0)
    ]


def test_plot_lanes_give_the_planners_plotter_jobs_moves_and_switches() -> None:
    lanes, switches = plot_lanes(build_timeline(recorded(), "g1"))
    assert [(round(s, 6), round(e, 6)) for s, e in switches] == [(1.1, 1.6), (3.0, 3.5), (5.0, 5.2)]
    assert [lane for lane in lanes if lane[0] == "[switch failed]"] == [
        ("[switch failed]", pytest.approx(4.0), pytest.approx(4.9), "failed")
    ]
    actor_a = [(round(s, 6), round(e, 6), k) for lane, s, e, k in lanes if lane == "actor-a"]
    assert actor_a == [
        (0.1, 1.1, "gpu:rollout"),
        (1.7, 3.5, "wait"),
        (3.5, 4.0, "gpu:rollout"),
        (5.0, 5.2, "wait"),
        (5.2, 6.0, "gpu:rollout"),
    ]
    assert {k for lane, _, _, k in lanes if lane.startswith(MOVES_LANE)} == {"snapshot", "restore"}
    seen: list[str] = []
    for lane, *_ in lanes:
        if lane not in seen:
            seen.append(lane)
    assert seen == ["[switch failed]", MOVES_LANE, f"{MOVES_LANE} #2", "actor-a", "actor-b"]


def _switch(*, parts: tuple[JobParts, ...]) -> list[Event]:
    """`a` holds, yields; the switch to `b` snapshots `a` on one node, restores `b`; the
    status after the switch lists `parts`."""
    return [
        Event(time=1.0, group="g", kind="GRANTED", job="a", epoch=1, detail="rollout"),
        Event(time=1.5, group="g", kind="QUEUED", job="b", detail="train"),
        Event(time=2.0, group="g", kind="YIELDED", job="a", epoch=1),
        Event(time=2.0, group="g", kind="SWITCH_STARTED", job="b", epoch=1, seq=1),
        Event(
            time=2.4,
            group="g",
            kind="SNAPSHOT_DONE",
            job="a",
            epoch=1,
            seconds=0.3,
            bytes=2_000_000_000,
            detail="node-1",
            seq=2,
            parts=parts,
        ),
        Event(
            time=2.4,
            group="g",
            kind="RESTORE_DONE",
            job="b",
            epoch=1,
            seconds=0.1,
            bytes=10,
            detail="node-1",
            seq=3,
            parts=parts,
        ),
        Event(
            time=2.4,
            group="g",
            kind="SWITCH_DONE",
            job="b",
            epoch=1,
            seconds=0.4,
            bytes=2_000_000_010,
            seq=4,
            parts=parts,
        ),
        Event(time=2.4, group="g", kind="GRANTED", job="b", epoch=2, detail="train", seq=5),
    ]


def test_a_partial_switchs_trace_names_the_parked_and_discarded_tags_of_the_outgoing_job() -> None:
    timeline = build_timeline(_switch(parts=(JobParts("a", ("p3",), ("p0",)),)))
    (switch,) = [i for i in timeline.intervals if i.category == "switch"]
    assert switch.name == "switch a (parked p3; discarded p0) -> b"
    assert switch.args["parked_parts"] == "p3"
    assert switch.args["discarded_parts"] == "p0"
    assert switch.args["outcome"] == "done"
    (snapshot,) = [i for i in timeline.intervals if i.category == "snapshot"]
    assert snapshot.name == "snapshot a (parked p3; discarded p0)"
    assert snapshot.args["parked_parts"] == "p3"
    assert snapshot.args["discarded_parts"] == "p0"
    (restore,) = [i for i in timeline.intervals if i.category == "restore"]
    assert restore.name == "restore b"
    assert "parked_parts" not in restore.args
    (parked,) = [i for i in timeline.instants if i.lane == "a" and i.name != "yielded"]
    assert (parked.name, parked.time) == ("parked p3; discarded p0", 2.4)
    assert parked.args == {"epoch": 1, "parked_parts": "p3", "discarded_parts": "p0"}
    trace = chrome_trace(timeline)
    assert json.loads(json.dumps(trace)) == trace
    by_name = {e["name"]: e for e in trace["traceEvents"] if e["ph"] in ("X", "i")}
    assert by_name["switch a (parked p3; discarded p0) -> b"]["args"]["parked_parts"] == "p3"
    assert by_name["parked p3; discarded p0"]["args"]["discarded_parts"] == "p0"


def test_a_whole_switch_names_no_parts() -> None:
    timeline = build_timeline(_switch(parts=()))
    names = sorted(i.name for i in timeline.intervals)
    assert names == ["restore b", "rollout", "snapshot a", "switch -> b", "train", "waiting"]
    assert [i.name for i in timeline.instants] == ["yielded"]
    for interval in timeline.intervals:
        assert "parked_parts" not in interval.args
        assert "discarded_parts" not in interval.args


def test_a_job_with_only_discarded_parts_names_just_those() -> None:
    timeline = build_timeline(_switch(parts=(JobParts("a", (), ("p0",)),)))
    (switch,) = [i for i in timeline.intervals if i.category == "switch"]
    assert switch.name == "switch a (discarded p0) -> b"
    assert "parked_parts" not in switch.args
    assert switch.args["discarded_parts"] == "p0"


def test_a_switch_parking_two_jobs_partly_names_each_and_not_an_earlier_parked_job() -> None:
    parts = (
        JobParts("old", ("p9",), ()),  # parked partly by an earlier switch: not this one's
        JobParts("a", ("p3",), ("p0",)),
        JobParts("c", ("p1",), ()),
    )
    events = _switch(parts=parts)
    second = Event(
        time=2.4, group="g", kind="SNAPSHOT_DONE", job="c", epoch=1, seconds=0.2, bytes=5,
        detail="node-1", seq=2, parts=parts,
    )  # fmt: skip
    timeline = build_timeline([*events[:5], second, *events[5:]])
    (switch,) = [i for i in timeline.intervals if i.category == "switch"]
    assert switch.name == "switch a (parked p3; discarded p0), c (parked p1) -> b"
    assert switch.args["parked_parts"] == "a: p3; c: p1"
    assert switch.args["discarded_parts"] == "a: p0"
    assert {(i.lane, i.name) for i in timeline.instants} == {
        ("a", "yielded"),
        ("a", "parked p3; discarded p0"),
        ("c", "parked p1"),
    }
    assert "old" not in timeline.lanes


def test_parts_read_the_same_from_proto_json_names_and_field_names() -> None:
    base = {"time": 1.0, "group": "g", "kind": "EVENT_KIND_SWITCH_DONE", "job": "b"}
    camel = {"jobs": [{"job": "a", "parkedParts": ["p3"], "discardedParts": ["p0"]}]}
    snake = {
        "jobs": [{"job": "a", "parked_parts": ["p3"], "discarded_parts": ["p0"]}, {"job": "b"}]
    }
    assert event_from_dict({**base, "status": camel}).parts == (JobParts("a", ("p3",), ("p0",)),)
    assert event_from_dict({**base, "status": camel}) == event_from_dict({**base, "status": snake})
    assert event_from_dict(base).parts == ()
