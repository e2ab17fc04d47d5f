"""Phase profiles: written by hand, read back, and built from a scheduler's events.

Cases:
- hand-written: the rollout/cpu/train shortcuts become a rollout (GPU), score (CPU),
  train (GPU) cycle; byte quantities (`256Mi`, `16Gi`, `1.5G`) parse; phases and
  shortcuts together, a cycle without a GPU phase, a name that is not a DNS label and a
  bad quantity are refused naming the field;
- a profile dumps to the document `load_profiles` reads back equal (one, a list, or
  `{profiles: [...]}`); `renamed` keeps everything but the name;
- the simulator's view keeps the state on GPU phases and the cycle's GPU fraction;
- percentiles interpolate between order statistics, and a uniform spread's jitter is
  recovered from p10..p90;
- from events: a job's one-off `load` phase is left out; holds become GPU phases named by
  the acquire's phase, yield-to-next-ask gaps become CPU phases, with percentiles and the
  number of cycles; a hold still open at the end is dropped; `jobs` picks jobs;
- switches: moved bytes are split between the job brought in and the one displaced, the
  copy rate is bytes over seconds, and the handoff is what a switch costs beyond its own
  seconds (from the group free and wanted to the switch's start, and to the grant).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from pydantic import ValidationError

from rlslice.planner.profile import (
    Percentiles,
    WorkloadProfile,
    dump_profiles,
    load_profiles,
    parse_bytes,
)
from rlslice.planner.profile_events import profiles_from_events

MiB = 1 << 20


@dataclass(frozen=True)
class Ev:
    """A scheduler event as `rlslice.apps.timeline.trace_export.Event` carries it."""

    time: float
    kind: str
    job: str = ""
    seconds: float = 0.0
    bytes: int = 0
    detail: str = ""
    seq: int = 0


def test_the_shortcuts_become_a_rollout_score_train_cycle() -> None:
    profile = WorkloadProfile.model_validate(
        {
            "name": "grpo-a",
            "rollout_seconds": 1.0,
            "cpu_seconds": 2.0,
            "train_seconds": 0.5,
            "state_bytes": "256Mi",
            "max_slowdown": 1.3,
        }
    )
    assert [(p.name, p.kind, p.seconds) for p in profile.phases] == [
        ("rollout", "gpu", 1.0),
        ("score", "cpu", 2.0),
        ("train", "gpu", 0.5),
    ]
    assert profile.state_bytes == 256 * MiB
    assert profile.parking_bytes == 256 * MiB
    assert profile.cycle_seconds == pytest.approx(3.5)
    assert profile.gpu_fraction == pytest.approx(1.5 / 3.5)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (4096, 4096),
        ("256Mi", 256 * MiB),
        ("16Gi", 16 << 30),
        ("1.5G", 1_500_000_000),
        ("80GB", 80 * 10**9),
    ],
)
def test_byte_quantities_parse(text: object, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (
            {
                "name": "a",
                "rollout_seconds": 1,
                "phases": [{"name": "x", "kind": "gpu", "seconds": 1}],
            },
            "phases",
        ),
        ({"name": "a", "cpu_seconds": 2.0}, "gpu phase"),
        ({"name": "Not_A_Label", "rollout_seconds": 1.0}, "name"),
        ({"name": "a", "rollout_seconds": 1.0, "state_bytes": "lots"}, "state_bytes"),
        ({"name": "a", "rollout_seconds": -1.0}, "seconds"),
        ({"name": "a", "rollout_seconds": 1.0, "max_slowdown": 0.5}, "max_slowdown"),
    ],
)
def test_bad_profiles_are_refused_naming_the_field(data: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        WorkloadProfile.model_validate(data)


def test_a_profile_dumps_to_what_loads_back_equal() -> None:
    profile = WorkloadProfile.model_validate(
        {
            "name": "thin",
            "rollout_seconds": 0.2,
            "cpu_seconds": 3.0,
            "train_seconds": 0.1,
            "state_bytes": 5,
            "host_bytes": 9,
        }
    )
    document = dump_profiles([profile, profile.renamed("thin-2")])
    again = load_profiles(document)
    assert again[0] == profile
    assert again[1].name == "thin-2"
    assert again[1].phases == profile.phases
    assert again[1].parking_bytes == 9
    assert load_profiles(document["profiles"][0]) == (profile,)
    assert load_profiles(document["profiles"]) == again


def test_the_simulator_view_keeps_the_state_on_gpu_phases() -> None:
    profile = WorkloadProfile.model_validate(
        {"name": "a", "rollout_seconds": 1.0, "cpu_seconds": 3.0, "state_bytes": 7}
    )
    job = profile.to_job_profile(name="b")
    assert job.name == "b"
    assert [(p.kind, p.device_bytes) for p in job.phases] == [("gpu", 7), ("cpu", 0)]
    assert job.gpu_fraction == pytest.approx(profile.gpu_fraction)


def test_percentiles_interpolate_and_recover_a_uniform_jitter() -> None:
    stats = Percentiles.of([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (stats.p10, stats.p50, stats.p90, stats.max) == pytest.approx((1.4, 3.0, 4.6, 5.0))
    spread = Percentiles.of([10 * (0.8 + 0.4 * i / 1000) for i in range(1001)])
    assert spread.jitter == pytest.approx(0.2, abs=0.005)
    assert Percentiles.of([2.0, 2.0]).jitter == 0.0


def _cycles(
    job: str,
    start: float,
    count: int,
    *,
    rollout: float,
    cpu: float,
    train: float,
    ask: float = 0.01,
) -> list[Ev]:
    """A job alone: a `load` phase, then `count` cycles of rollout, CPU, train."""
    events = [
        Ev(start, "QUEUED", job, detail="load"),
        Ev(start, "GRANTED", job, detail="load"),
        Ev(start + 0.5, "YIELDED", job),
    ]
    now = start + 0.5 + ask
    for _ in range(count):
        for phase, hold, gap in (("rollout", rollout, cpu), ("train", train, ask)):
            events += [
                Ev(now, "QUEUED", job, detail=phase),
                Ev(now, "GRANTED", job, detail=phase),
                Ev(now + hold, "YIELDED", job),
            ]
            now += hold + gap
    return events


def test_holds_and_gaps_become_the_cycle_and_the_load_phase_is_left_out() -> None:
    events = _cycles("grpo-a", 100.0, 6, rollout=1.0, cpu=2.0, train=0.5)
    (profile,) = profiles_from_events(events, state_bytes=3)
    assert [(p.name, p.kind) for p in profile.phases] == [
        ("rollout", "gpu"),
        ("after-rollout", "cpu"),
        ("train", "gpu"),
        ("after-train", "cpu"),
    ]
    seconds = [p.seconds for p in profile.phases]
    assert seconds == pytest.approx([1.0, 2.0, 0.5, 0.01])
    assert profile.phases[0].stats is not None
    assert profile.phases[0].stats.count == 6
    assert profile.cycles == 5
    assert profile.cycle_seconds_measured is not None
    assert profile.cycle_seconds_measured.p50 == pytest.approx(3.51)
    assert profile.state_bytes == 3
    assert profile.switching is not None
    assert profile.switching.switches == 0


def test_a_hold_open_at_the_end_is_dropped_and_jobs_pick_jobs() -> None:
    events = _cycles("a", 0.0, 4, rollout=1.0, cpu=2.0, train=0.5)
    events += _cycles("b", 0.0, 4, rollout=0.3, cpu=1.0, train=0.2)
    events.append(Ev(50.0, "GRANTED", "a", detail="rollout"))  # never yielded
    (b,) = profiles_from_events(events, jobs=["b"])
    assert b.name == "b"
    assert b.phases[0].seconds == pytest.approx(0.3)
    (a,) = profiles_from_events(events, jobs=["a"])
    assert a.phases[0].stats is not None
    assert a.phases[0].stats.count == 4


def test_varying_holds_give_percentiles_not_only_means() -> None:
    events: list[Ev] = []
    now = 0.0
    for hold in (1.0, 1.0, 1.0, 1.0, 3.0):
        events += [
            Ev(now, "QUEUED", "a", detail="rollout"),
            Ev(now, "GRANTED", "a", detail="rollout"),
            Ev(now + hold, "YIELDED", "a"),
        ]
        now += hold + 1.0
    (profile,) = profiles_from_events(events)
    stats = profile.phases[0].stats
    assert stats is not None
    assert stats.p50 == pytest.approx(1.0)
    assert stats.mean == pytest.approx(1.4)
    assert stats.max == pytest.approx(3.0)
    assert profile.phases[0].seconds == pytest.approx(1.0)  # the median runs in the simulator


def test_switches_give_state_bytes_the_copy_rate_and_the_handoff() -> None:
    events = [
        Ev(0.0, "QUEUED", "a", detail="rollout"),
        Ev(0.0, "GRANTED", "a", detail="rollout"),
        Ev(0.5, "QUEUED", "b", detail="rollout"),
        Ev(1.0, "YIELDED", "a"),
        Ev(1.1, "SWITCH_STARTED", "b", detail="attempt 1"),
        Ev(1.5, "SWITCH_DONE", "b", seconds=0.4, bytes=200 * MiB),
        Ev(1.52, "GRANTED", "b", detail="rollout"),
        Ev(2.0, "QUEUED", "a", detail="rollout"),
        Ev(2.5, "YIELDED", "b"),
        Ev(2.5, "SWITCH_STARTED", "a", detail="attempt 1; evict b"),
        Ev(2.7, "SWITCH_DONE", "a", seconds=0.2, bytes=100 * MiB),
        Ev(2.7, "GRANTED", "a", detail="rollout"),
        Ev(3.7, "YIELDED", "a"),
        Ev(5.0, "QUEUED", "b", detail="rollout"),
        Ev(5.0, "GRANTED", "b", detail="rollout"),
        Ev(5.5, "YIELDED", "b"),
    ]
    a, b = profiles_from_events(events)
    assert b.switching is not None
    assert b.switching.switches == 1
    assert b.switching.moved_bytes == 200 * MiB
    assert b.switching.bandwidth_bytes_per_s == pytest.approx(200 * MiB / 0.4)
    assert b.switching.handoff_seconds is not None
    assert b.switching.handoff_seconds.p50 == pytest.approx(0.1 + 0.02)
    assert a.switching is not None
    assert a.switching.handoff_seconds is not None
    assert a.switching.handoff_seconds.p50 == pytest.approx(0.0)
    # Each switch's bytes split between the job brought in and the one it displaced.
    assert b.state_bytes == round(75 * MiB)
    assert a.state_bytes == round(75 * MiB)
