"""Hypotheses from a scheduler's Prometheus metrics, in the spirit of `diagnose_pipeline`.

Reads the text exposition of `rlslice_scheduler_*` (parsed with prometheus_client's text
parser, imported on use) into plain values per group, then applies thresholds. Metrics
without a `group` label (the acquire-wait and switch histograms, moved bytes) describe
the whole scheduler and are reported under `ALL_GROUPS`.

Like the course's rule set, each line is something to measure next, not a verdict.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from rlslice._errors import InvalidArgumentError

#: Key of the scheduler-wide figures.
ALL_GROUPS = "*"

#: Below this busy fraction a group has room for another job.
LOW_BUSY = 0.5
#: Mean seconds to acquire above which jobs lose noticeable time waiting.
LONG_WAIT_S = 30.0
#: Mean seconds per switch above which switching deserves a profile.
SLOW_SWITCH_S = 10.0
#: Effective switch bandwidth (bytes/s) below which copies are suspiciously slow.
SLOW_BANDWIDTH = 5e9
#: Outcomes of `rlslice_scheduler_switches_total` that are not failures.
OK_OUTCOMES = frozenset({"done", "ok", "success", "coresident", "deferred"})

FALLBACK = "inspect a stage-level trace (rlslice timeline)"


@dataclass
class GroupMetrics:
    """What the metrics say about one group (or, under `ALL_GROUPS`, the scheduler)."""

    group: str
    busy_fraction: float | None = None
    queue_depth: float | None = None
    acquire_wait_count: float = 0.0
    acquire_wait_sum: float = 0.0
    switch_count: float = 0.0
    switch_seconds_sum: float = 0.0
    moved_bytes: float = 0.0
    switches_by_outcome: dict[str, float] = field(default_factory=dict)

    @property
    def mean_acquire_wait_s(self) -> float | None:
        return self.acquire_wait_sum / self.acquire_wait_count if self.acquire_wait_count else None

    @property
    def mean_switch_s(self) -> float | None:
        return self.switch_seconds_sum / self.switch_count if self.switch_count else None


def parse_scheduler_metrics(text: str) -> dict[str, GroupMetrics]:
    """Group the `rlslice_scheduler_*` samples of a text exposition by their `group` label."""
    if not isinstance(text, str):
        raise InvalidArgumentError("text must be a Prometheus text exposition (str)")
    from prometheus_client.parser import text_string_to_metric_families

    groups: dict[str, GroupMetrics] = {}

    def of(labels: Mapping[str, str]) -> GroupMetrics:
        name = labels.get("group", ALL_GROUPS)
        return groups.setdefault(name, GroupMetrics(name))

    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as error:
        raise InvalidArgumentError(
            f"metrics text is not a Prometheus exposition: {error}"
        ) from None
    for family in families:
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, float(sample.value)
            if name == "rlslice_scheduler_busy_fraction":
                of(labels).busy_fraction = value
            elif name == "rlslice_scheduler_queue_depth":
                of(labels).queue_depth = value
            elif name == "rlslice_scheduler_acquire_wait_seconds_count":
                of(labels).acquire_wait_count += value
            elif name == "rlslice_scheduler_acquire_wait_seconds_sum":
                of(labels).acquire_wait_sum += value
            elif name == "rlslice_scheduler_switch_seconds_count":
                of(labels).switch_count += value
            elif name == "rlslice_scheduler_switch_seconds_sum":
                of(labels).switch_seconds_sum += value
            elif name == "rlslice_scheduler_moved_bytes_total":
                of(labels).moved_bytes += value
            elif name == "rlslice_scheduler_switches_total":
                outcomes = of(labels).switches_by_outcome
                outcome = labels.get("outcome", "unknown")
                outcomes[outcome] = outcomes.get(outcome, 0.0) + value
    return groups


def diagnose_group(metrics: GroupMetrics) -> list[str]:
    """Hypotheses for one group, in a fixed order; the fallback when nothing fires."""
    out = []
    where = "the scheduler" if metrics.group == ALL_GROUPS else f"group {metrics.group}"
    busy = metrics.busy_fraction
    if busy is not None and busy < LOW_BUSY:
        out.append(
            f"{where} is busy {busy:.0%} of the time: its jobs' GPU phases leave gaps; add a job "
            "whose GPU phases fit them (rlslice simulate predicts the gain)"
        )
    depth = metrics.queue_depth or 0.0
    if busy is not None and busy >= 0.95 and depth >= 1:
        out.append(f"{where} is saturated with {depth:g} waiter(s): move a job to another group")
    wait = metrics.mean_acquire_wait_s
    if wait is not None and wait > LONG_WAIT_S:
        out.append(
            f"acquires in {where} wait {wait:.1f} s on average: the group is oversubscribed or "
            "holds are long; compare phase lengths and max_hold_seconds"
        )
    switch = metrics.mean_switch_s
    if switch is not None and switch > SLOW_SWITCH_S:
        out.append(
            f"switches in {where} take {switch:.1f} s on average: profile snapshot and restore "
            "(backend, pinned host memory, room for co-residency)"
        )
    if metrics.switch_seconds_sum > 0 and metrics.moved_bytes > 0:
        rate = metrics.moved_bytes / metrics.switch_seconds_sum
        if rate < SLOW_BANDWIDTH:
            out.append(
                f"switches in {where} move state at {rate / 1e9:.2f} GB/s: check host<->device "
                "copies (pinned memory, PCIe/NVLink topology, backend)"
            )
    failed = {
        k: v for k, v in metrics.switches_by_outcome.items() if k not in OK_OUTCOMES and v > 0
    }
    if failed:
        listed = ", ".join(f"{count:g} {outcome}" for outcome, count in sorted(failed.items()))
        out.append(
            f"switches in {where} did not complete ({listed}): read the snapshot agents' logs"
        )
    return out or [FALLBACK]


def diagnose_scheduler_metrics(text: str) -> dict[str, list[str]]:
    """Hypotheses per group (and `ALL_GROUPS` for scheduler-wide figures) from metrics text."""
    return {name: diagnose_group(m) for name, m in sorted(parse_scheduler_metrics(text).items())}
