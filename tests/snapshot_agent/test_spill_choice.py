"""Which parked parts spill when parking more would break the host budget (pure).

Case matrix:

| case | expected |
|---|---|
| the park fits the budget | nothing spills |
| it does not: least recently parked job first | its parts, in name order, until the park fits |
| one part of the oldest job is enough | only that part |
| the oldest job is kept (being moved) | the next oldest spills instead |
| pending bytes of other moves count | more spills |
| host memory short of the reserve (a shortfall) | at least the shortfall spills, budget or not |
| a shortfall larger than every part | everything spills, no refusal (the host-memory guard decides) |
| even everything else would not do | a refusal naming the budget; nothing spills |
| empty parts | never chosen |
"""

from __future__ import annotations

import pytest

from rlslice.snapshot_agent.spill_choice import ParkedPart, SpillPlan, choose

MiB = 1 << 20

PARTS = [
    ParkedPart("job-b", "w.bin", 4 * MiB, parked_at=20.0),
    ParkedPart("job-a", "w.bin", 4 * MiB, parked_at=10.0),
    ParkedPart("job-a", "o.bin", 2 * MiB, parked_at=10.0),
    ParkedPart("job-c", "w.bin", 4 * MiB, parked_at=30.0),
    ParkedPart("job-c", "empty.bin", 0, parked_at=5.0),
]


def spilled(plan: SpillPlan) -> list[tuple[str, str]]:
    return [(p.job, p.name) for p in plan.spill]


@pytest.mark.parametrize(
    ("incoming", "budget", "keep", "pending", "expected"),
    [
        (2 * MiB, 16 * MiB, frozenset(), 0, []),
        (4 * MiB, 16 * MiB, frozenset(), 0, [("job-a", "o.bin")]),
        (6 * MiB, 16 * MiB, frozenset(), 0, [("job-a", "o.bin"), ("job-a", "w.bin")]),
        (8 * MiB, 16 * MiB, frozenset(), 0, [("job-a", "o.bin"), ("job-a", "w.bin")]),
        (
            9 * MiB,
            16 * MiB,
            frozenset(),
            0,
            [("job-a", "o.bin"), ("job-a", "w.bin"), ("job-b", "w.bin")],
        ),
        (4 * MiB, 16 * MiB, frozenset({"job-a"}), 0, [("job-b", "w.bin")]),
        (2 * MiB, 16 * MiB, frozenset(), 4 * MiB, [("job-a", "o.bin"), ("job-a", "w.bin")]),
    ],
    ids=[
        "fits",
        "one-part-of-the-oldest-job",
        "the-oldest-job-whole",
        "exactly-the-oldest-job",
        "then-the-next-oldest",
        "the-oldest-kept",
        "pending-bytes-count",
    ],
)
def test_the_least_recently_parked_parts_spill_until_the_park_fits(
    incoming: int, budget: int, keep: frozenset[str], pending: int, expected: list[tuple[str, str]]
) -> None:
    plan = choose(PARTS, incoming=incoming, budget=budget, keep=keep, pending=pending)
    assert plan.refusal is None
    assert spilled(plan) == expected
    kept_in_host = sum(p.nbytes for p in PARTS) - plan.nbytes
    assert kept_in_host + pending + incoming <= budget


def test_a_park_that_cannot_fit_even_with_everything_spilled_is_refused() -> None:
    plan = choose(PARTS, incoming=12 * MiB, budget=10 * MiB, keep=frozenset({"job-c"}))
    assert plan.spill == ()
    assert plan.refusal is not None
    assert "budget of 10.00 MiB" in plan.refusal
    assert "frees only 10.00 MiB" in plan.refusal


def test_host_memory_short_of_the_reserve_spills_more_than_the_budget_asks() -> None:
    plan = choose(PARTS, incoming=2 * MiB, budget=64 * MiB, shortfall=5 * MiB)
    assert plan.refusal is None
    assert spilled(plan) == [("job-a", "o.bin"), ("job-a", "w.bin")]


def test_a_shortfall_spilling_cannot_cover_spills_what_there_is_without_refusing() -> None:
    plan = choose(PARTS, incoming=2 * MiB, budget=64 * MiB, shortfall=64 * MiB)
    assert plan.refusal is None  # the host-memory guard refuses what is still short
    assert plan.nbytes == 14 * MiB


def test_an_empty_part_is_never_chosen() -> None:
    plan = choose(PARTS, incoming=15 * MiB, budget=16 * MiB)
    assert ("job-c", "empty.bin") not in spilled(plan)
    assert plan.nbytes >= 13 * MiB
