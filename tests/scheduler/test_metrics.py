"""The scheduler's metrics: per-group series looked up once, dropped with their group.

Cases: writing a group's queue depth, held seconds, preemptions and switch outcomes many
times looks each labelled series up once; a series appears when first written (a group that
was never preempted has no preemption series); the holder series follows the holder (one
per group, none while free); deleting a group drops all its series, switch outcomes
included, and a group created again under the same name reports afresh (no stale handle
writes into a dropped series); a live scheduler's DeleteGroup drops the group's series.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from prometheus_client import generate_latest

from rlslice.scheduler.metrics import SchedulerMetrics
from rlslice.v1alpha1 import scheduler_pb2 as pb

if TYPE_CHECKING:
    from conftest import Live


def _text(metrics: SchedulerMetrics) -> str:
    return generate_latest(metrics.registry).decode()


def _count_labels(monkeypatch: pytest.MonkeyPatch, metric: Any) -> list[tuple[str, ...]]:
    calls: list[tuple[str, ...]] = []
    original = metric.labels

    def counting(*values: str) -> Any:
        calls.append(values)
        return original(*values)

    monkeypatch.setattr(metric, "labels", counting)
    return calls


def test_each_series_of_a_group_is_looked_up_once(monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = SchedulerMetrics()
    depth = _count_labels(monkeypatch, metrics.queue_depth)
    held = _count_labels(monkeypatch, metrics.held_seconds)
    switches = _count_labels(monkeypatch, metrics.switches)
    for n in range(50):
        metrics.set_queue_depth("g", n)
        metrics.add_held("g", 0.5)
        metrics.count_switch("g", "done")
    metrics.count_switch("g", "failed")
    assert depth == [("g",)]
    assert held == [("g",)]
    assert switches == [("g", "done"), ("g", "failed")]
    text = _text(metrics)
    assert 'rlslice_scheduler_queue_depth{group="g"} 49.0' in text
    assert 'rlslice_scheduler_held_seconds_total{group="g"} 25.0' in text
    assert 'rlslice_scheduler_switches_total{group="g",outcome="done"} 50.0' in text


def test_a_series_appears_when_first_written() -> None:
    metrics = SchedulerMetrics()
    metrics.set_queue_depth("g", 0)
    text = _text(metrics)
    assert 'rlslice_scheduler_queue_depth{group="g"} 0.0' in text
    assert 'rlslice_scheduler_preemptions_total{group="g"}' not in text
    metrics.count_preemption("g")
    assert 'rlslice_scheduler_preemptions_total{group="g"} 1.0' in _text(metrics)


def test_the_holder_series_follows_the_holder() -> None:
    metrics = SchedulerMetrics()
    metrics.set_holder("g", "a")
    metrics.set_holder("h", "a")
    metrics.set_holder("g", "b")
    text = _text(metrics)
    assert 'rlslice_scheduler_holder{group="g",job="b"} 1.0' in text
    assert 'rlslice_scheduler_holder{group="g",job="a"}' not in text
    assert 'rlslice_scheduler_holder{group="h",job="a"} 1.0' in text
    metrics.set_holder("g", None)
    text = _text(metrics)
    assert 'group="g"' not in text
    assert "# TYPE rlslice_scheduler_holder gauge" in text
    assert metrics.holders() == {"h": "a"}


def test_a_deleted_group_loses_every_series_and_a_new_one_reports_afresh() -> None:
    metrics = SchedulerMetrics()
    metrics.set_queue_depth("g", 3)
    metrics.add_held("g", 2.0)
    metrics.count_preemption("g")
    metrics.count_switch("g", "done")
    metrics.count_switch("g", "faulted")
    metrics.set_holder("g", "a")
    metrics.set_queue_depth("other", 1)
    metrics.forget_group("g")
    text = _text(metrics)
    assert 'group="g"' not in text
    assert 'rlslice_scheduler_queue_depth{group="other"} 1.0' in text
    metrics.set_queue_depth("g", 5)
    metrics.count_switch("g", "done")
    text = _text(metrics)
    assert 'rlslice_scheduler_queue_depth{group="g"} 5.0' in text
    assert 'rlslice_scheduler_switches_total{group="g",outcome="done"} 1.0' in text


async def test_deleting_a_group_on_a_live_scheduler_drops_its_series(live: Live) -> None:
    a = await live.register("a")
    await live.acquire("a", a)
    await live.yield_("a", a)
    await live.acquire("a", a)
    metrics = live.running.metrics
    assert metrics.holders() == {"g": "a"}
    assert 'rlslice_scheduler_held_seconds_total{group="g"}' in _text(metrics)
    await live.stub.DeleteGroup(pb.DeleteGroupRequest(group="g", force=True))
    assert metrics.holders() == {}
    assert 'group="g"' not in _text(metrics)
