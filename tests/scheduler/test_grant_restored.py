"""`GrantAction.restored` is true only when bytes came back (the pure core).

A switch to a parked job whose restores moved nothing (no agent knew the job: a job that
never registered its processes, a group of lock-only jobs) grants with `restored=False`.

Cases (the switch's report -> the grant's `restored`):
- restored_bytes > 0 -> True;
- restored_bytes == 0, though the snapshots moved bytes -> False;
- no restored_bytes (a coordinator that does not tell them apart) -> whether anything moved;
- a job that was never parked -> False, whatever moved.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rlslice.scheduler.core import events

from .conftest import Driver


def _parked_b_comes_back(new: Callable[..., Driver], **report: int) -> bool:
    d = new()
    d.register("a")
    d.register("b")
    d.acquire("a")
    d.finish_switch()  # a's first acquire: a switch that restores nothing
    d.acquire("b")
    d.apply(events.Yield("a"))
    d.finish_switch()  # b runs, a is parked
    d.acquire("a")
    d.apply(events.Yield("b"))
    switch = d.state.switch
    assert switch is not None
    assert switch.restore  # a comes back from host memory
    d.apply(events.SwitchDone(switch.epoch, switch.candidates, seconds=0.01, **report))
    assert d.grants[-1].job == "a"
    return d.grants[-1].restored


@pytest.mark.parametrize(
    ("report", "restored"),
    [
        ({"moved_bytes": 300, "restored_bytes": 100}, True),
        ({"moved_bytes": 200, "restored_bytes": 0}, False),
        ({"moved_bytes": 0, "restored_bytes": 0}, False),
        ({"moved_bytes": 100}, True),
        ({"moved_bytes": 0}, False),
    ],
)
def test_a_grant_says_restored_only_when_bytes_came_back(
    new: Callable[..., Driver], report: dict[str, int], restored: bool
) -> None:
    assert _parked_b_comes_back(new, **report) is restored


def test_a_job_never_parked_is_not_restored_whatever_moved(new: Callable[..., Driver]) -> None:
    d = new()
    d.register("a")
    d.register("b")
    d.acquire("a")
    d.finish_switch()
    d.acquire("b")
    d.apply(events.Yield("a"))
    switch = d.state.switch
    assert switch is not None
    assert not switch.restore  # b never ran
    d.apply(events.SwitchDone(switch.epoch, switch.candidates, 500, 0.01, restored_bytes=500))
    assert d.grants[-1].restored is False
