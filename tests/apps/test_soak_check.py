"""The soak's history checker (`rlslice.apps.bench.soak.check`) on hand-made histories:
each rule it checks is broken once, and a clean history passes.

| history | verdict |
|---|---|
| a grants, yields; b grants after | clean |
| b granted while a still holds | two holders |
| a's lock lost (its yield refused) overlapping b's later grant of a higher epoch | fenced, not a violation |
| the same with b's epoch lower | two holders |
| epochs not rising | epoch did not rise |
| an acquire never answered (job not killed) | never answered |
| bytes changed while parked | device bytes changed |
| a partition fault | counted apart from kills |
"""

from __future__ import annotations

from typing import Any

from rlslice.apps.bench.soak.check import check


def _job(job: str, *events: tuple[float, str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"t": t, "ev": ev, "job": job, "group": "g", **extra} for t, ev, extra in events]


def _hold(job: str, start: float, end: float, epoch: int, lost: bool = False) -> list[Any]:
    events = [
        (start - 0.1, "acquire", {}),
        (start, "granted", {"epoch": epoch}),
        (end, "yield", {}),
    ]
    if lost:
        events.append((end + 0.01, "yield_failed", {"kind": "NotFoundError"}))
    events.append((end + 0.5, "stopped", {}))
    return _job(job, *events)


def test_a_clean_history_passes() -> None:
    report = check([*_hold("a", 1, 2, 1), *_hold("b", 3, 4, 3)])
    assert report.violations == []
    assert report.grants == 2


def test_overlapping_holders_are_a_violation() -> None:
    report = check([*_hold("a", 1, 3, 1), *_hold("b", 2, 4, 3)])
    assert any("two holders" in v for v in report.violations)


def test_a_lost_lock_overlapping_a_higher_epoch_is_fenced_not_a_violation() -> None:
    report = check([*_hold("a", 1, 3, 1, lost=True), *_hold("b", 2, 4, 3)])
    assert report.violations == []
    assert report.fenced == 1
    assert report.lost == 1


def test_a_lost_lock_overlapping_a_lower_epoch_is_a_violation() -> None:
    report = check([*_hold("a", 1, 3, 5, lost=True), *_hold("b", 2, 4, 3)])
    assert any("two holders" in v for v in report.violations)


def test_epochs_that_do_not_rise_are_a_violation() -> None:
    report = check([*_hold("a", 1, 2, 4), *_hold("b", 3, 4, 4)])
    assert any("epoch did not rise" in v for v in report.violations)


def test_an_unanswered_acquire_is_a_violation() -> None:
    report = check(_job("a", (1, "acquire", {}), (2, "stopped", {})))
    assert any("never answered" in v for v in report.violations)


def test_bytes_changed_while_parked_are_a_violation() -> None:
    report = check(_job("a", (1, "checked", {"ok": False}), (2, "stopped", {})))
    assert any("bytes changed" in v for v in report.violations)


def test_a_partition_is_counted_apart_from_kills() -> None:
    fault = {"t": 0.5, "ev": "fault", "kind": "partition", "target": "a"}
    report = check([fault, *_hold("a", 1, 2, 1)])
    assert report.partitions == 1
    assert dict(report.faults) == {}
