"""The placement advisor.

Cases:
- two jobs whose GPU phases fit in each other's CPU phases share a group; the fleet busy
  fraction rises from the dedicated one, and a job nobody fits beside stays alone;
- bounds, each refused with a sentence naming it: a simulated slowdown over the job's bound
  (a job's own `max_slowdown` overrides the advisor's), GPU demand over every member's
  bound (refused without a simulation), host memory for parking, device memory (a job
  that fits no GPU is a placement problem and left out); more groups than available;
- switch cost counts: a slower copy rate means fewer busy seconds and more slowdown;
- the search: exhaustive up to `exhaustive_jobs`, a heuristic above; on small random
  cases the heuristic comes within 5% of the exhaustive best (mean within 1%); 32 jobs
  are advised within a generous bound (the figure itself: `rlslice bench advise`); the
  same input gives the same advice;
- bad input (no profiles, repeated names) is refused naming it.
"""

from __future__ import annotations

import random
import time

import pytest

from rlslice._errors import InvalidArgumentError
from rlslice.apps.bench.advise import HARDWARE, random_jobs
from rlslice.planner.advisor import Hardware, advise, gap_to_exhaustive
from rlslice.planner.profile import WorkloadProfile

GIB = 1 << 30
#: the demo's scale: seconds-long phases, states that move in tens of milliseconds
HW = Hardware(gpu_bytes=1 * GIB, host_bytes=16 * GIB, bandwidth_bytes_per_s=25e9, overhead_s=0.02)


def job(
    name: str, rollout: float, cpu: float, train: float, gib: float = 0.6, **extra: object
) -> WorkloadProfile:
    return WorkloadProfile.model_validate(
        {
            "name": name,
            "rollout_seconds": rollout,
            "cpu_seconds": cpu,
            "train_seconds": train,
            "state_bytes": round(gib * GIB),
            **extra,
        }
    )


def grpo(name: str, **extra: object) -> WorkloadProfile:
    return job(name, 1.05, 2.32, 0.63, **extra)


def test_interleaving_jobs_share_a_group_and_a_job_nobody_fits_beside_stays_alone() -> None:
    heavy = job("heavy", 2.5, 0.5, 1.0)
    advice = advise([grpo("a"), grpo("b"), heavy], HW)
    groups = {g.jobs for g in advice.groups}
    assert groups == {("a", "b"), ("heavy",)}
    pair = next(g for g in advice.groups if g.jobs == ("a", "b"))
    assert pair.allowed
    assert 0.75 < pair.busy_fraction < 0.85
    assert all(1.0 <= s <= 1.2 for s in pair.slowdowns)
    assert pair.switches_per_hour > 0
    assert advice.busy_fraction > advice.dedicated_busy_fraction + 0.15
    assert advice.method == "exhaustive"


def test_a_simulated_slowdown_over_the_bound_is_refused_naming_the_job_and_the_bound() -> None:
    # Demand 0.42 + 0.75 = 1.17 passes the demand bound (1.2); the simulation (1.23x) does not.
    medium = job("medium", 1.7, 1.0, 1.3)
    advice = advise([grpo("a"), medium], HW)
    (pair,) = [c for c in advice.candidates if c.jobs == ("a", "medium")]
    assert pair.simulated
    assert not pair.allowed
    assert any("slowdown" in p and "exceeds its bound 1.20x" in p for p in pair.problems)
    assert {g.jobs for g in advice.groups} == {("a",), ("medium",)}
    assert pair in advice.refused


def test_a_jobs_own_bound_overrides_the_advisors() -> None:
    medium = job("medium", 1.7, 1.0, 1.3, max_slowdown=3.0)
    patient = grpo("a", max_slowdown=3.0)
    advice = advise([patient, medium], HW)
    assert {g.jobs for g in advice.groups} == {("a", "medium")}


def test_demand_over_every_bound_is_refused_without_a_simulation() -> None:
    advice = advise([job("x", 2.5, 0.5, 1.0), job("y", 2.5, 0.5, 1.0)], HW)
    (pair,) = advice.candidates
    assert not pair.simulated
    assert advice.evaluations == 0
    assert advice.pruned == 1
    assert pair.problems[0].startswith("demand: the GPU phases need 175% of the group")
    assert "slowdown is at least 1.75x" in pair.problems[0]


def test_parking_beyond_host_memory_is_refused_naming_host_memory() -> None:
    small_host = Hardware(gpu_bytes=1 * GIB, host_bytes=1 * GIB, bandwidth_bytes_per_s=25e9)
    advice = advise([grpo("a"), grpo("b")], small_host)
    (pair,) = advice.candidates
    assert "(host memory)" in pair.problems[0]
    assert len(advice.groups) == 2


def test_a_job_bigger_than_the_gpu_is_a_placement_problem_and_left_out() -> None:
    advice = advise([grpo("a"), grpo("b"), grpo("huge", gib=2)], HW)
    assert any("huge" in p and "(device memory)" in p for p in advice.problems)
    assert {g.jobs for g in advice.groups} == {("a", "b")}


def test_more_groups_than_available_is_a_problem() -> None:
    advice = advise([job("x", 2.5, 0.5, 1.0), job("y", 2.5, 0.5, 1.0)], HW, max_groups=1)
    assert advice.problems == ("the placement needs 2 groups; only 1 are available",)


def test_a_slower_copy_rate_costs_busy_time_and_slowdown() -> None:
    fast = advise([grpo("a"), grpo("b")], HW)
    slow = advise(
        [grpo("a"), grpo("b")],
        Hardware(
            gpu_bytes=1 * GIB, host_bytes=16 * GIB, bandwidth_bytes_per_s=1e9, overhead_s=0.02
        ),
        max_slowdown=5,
    )
    assert slow.groups[0].busy_fraction < fast.groups[0].busy_fraction - 0.05
    assert max(slow.groups[0].slowdowns) > max(fast.groups[0].slowdowns)


def test_the_heuristic_comes_close_to_the_exhaustive_best_on_small_cases() -> None:
    rng = random.Random(7)
    gaps = []
    for _ in range(6):
        heuristic, exact = gap_to_exhaustive(random_jobs(7, rng), HARDWARE)
        assert heuristic <= exact + 1e-9
        gaps.append(1 - heuristic / exact)
    assert max(gaps) < 0.05
    assert sum(gaps) / len(gaps) < 0.01


def test_thirty_two_jobs_are_advised_quickly_and_the_same_way_twice() -> None:
    jobs = random_jobs(32, random.Random(0))
    began = time.perf_counter()
    first = advise(jobs, HARDWARE)
    took = time.perf_counter() - began
    assert first.method == "heuristic"
    assert took < 30.0  # generous: 2 s on a quiet 2-core machine (rlslice bench advise)
    assert sorted(j for g in first.groups for j in g.jobs) == sorted(j.name for j in jobs)
    assert all(g.allowed and 1 <= len(g.jobs) <= 4 for g in first.groups)
    assert first.busy_fraction > first.dedicated_busy_fraction + 0.2
    again = advise(jobs, HARDWARE)
    assert [g.jobs for g in again.groups] == [g.jobs for g in first.groups]


@pytest.mark.parametrize(
    ("profiles", "message"),
    [([], "profiles must not be empty"), ([grpo("a"), grpo("a")], "distinct names")],
)
def test_bad_input_is_refused_naming_it(profiles: list[WorkloadProfile], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        advise(profiles, HW)
