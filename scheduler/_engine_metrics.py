"""What the engine's transitions and actions mean for the scheduler's metrics: the one
place that maps core outcomes to series, so the engine only says what happened."""

from __future__ import annotations

from rlslice.scheduler.core import GroupState, actions
from rlslice.scheduler.core.actions import Kind
from rlslice.scheduler.metrics import SchedulerMetrics


def count_record(metrics: SchedulerMetrics, group: str, record: actions.Record) -> None:
    """Count an event-ring record: switch outcomes, moved bytes, prefetch outcomes."""
    kind = record.kind
    if kind is Kind.SWITCH_DONE:
        metrics.switch_seconds.observe(record.seconds)
        metrics.moved_bytes.inc(record.bytes)
        metrics.count_switch(group, "done")
    elif kind is Kind.SWITCH_FAILED:
        metrics.count_switch(group, "failed")
    elif kind is Kind.FAULTED:
        metrics.count_switch(group, "faulted")
    elif kind is Kind.PREFETCH and record.detail not in ("started", "undoing"):
        metrics.count_prefetch(group, record.detail.partition(":")[0])


def count_action(metrics: SchedulerMetrics, group: str, action: actions.Action) -> None:
    """Count what an action tells: a grant's wait, a hold's length, a preemption."""
    if isinstance(action, actions.GrantAction):
        metrics.acquire_wait.observe(action.waited_seconds)
    elif isinstance(action, actions.HoldEnded):
        metrics.add_held(group, action.seconds)
    elif isinstance(action, actions.Preempt):
        metrics.count_preemption(group)


def follow_transition(metrics: SchedulerMetrics, before: GroupState, after: GroupState) -> None:
    """Keep the holder and queue-depth series in step with the state."""
    if after.holder != before.holder:
        metrics.set_holder(after.name, after.holder)
    if after.queue is not before.queue:
        metrics.set_queue_depth(after.name, len(after.queue))


def load_group(metrics: SchedulerMetrics, state: GroupState) -> None:
    """The series of a group loaded from the store."""
    metrics.set_queue_depth(state.name, len(state.queue))
    metrics.set_holder(state.name, state.holder)
