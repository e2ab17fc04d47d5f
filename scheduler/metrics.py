"""Prometheus metrics of one scheduler, in a private registry (tests run several at once).

No job ids as labels, except on `rlslice_scheduler_holder`, which has one series per
group (the current holder) and so stays bounded.

The engine updates these on every event, so the hot path avoids prometheus_client's
`labels()` (label validation and a locked lookup, ~30 µs): each group's series are looked up
once and kept in `_GroupSeries` until the group is deleted, and the holder series, which
changes at every grant and yield, is built at scrape time from a plain dict.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from rlslice.adapters.server import MetricsEndpoint, serve_metrics

_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
    120, 300, 600,
)  # fmt: skip


class _BusyCollector(Collector):
    """Computes busy fractions at scrape time (they change with time, not with events)."""

    def __init__(self, source: Callable[[], Iterable[tuple[str, float]]]) -> None:
        self._source = source

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "rlslice_scheduler_busy_fraction",
            "Fraction of the last 60 s each group was held",
            labels=["group"],
        )
        for group, fraction in self._source():
            family.add_metric([group], fraction)
        yield family


class _HolderCollector(Collector):
    """`rlslice_scheduler_holder`: 1 for each group's current holder, read at scrape time.

    A labelled Gauge would remove one child and create another at every change of holder
    (~60 µs); the engine only writes a dict entry instead."""

    def __init__(self, holders: dict[str, str]) -> None:
        self._holders = holders

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "rlslice_scheduler_holder",
            "1 for the job holding each group",
            labels=["group", "job"],
        )
        # A copy: the scrape runs on the HTTP server's thread while the loop writes.
        for group, job in list(self._holders.items()):
            family.add_metric([group, job], 1.0)
        yield family


class _GroupSeries:
    """One group's labelled series, each looked up the first time it is written (so a
    series appears when it did before: a group's first preemption creates its counter)."""

    __slots__ = ("held", "outcomes", "preemptions", "queue_depth")

    def __init__(self) -> None:
        self.queue_depth: Gauge | None = None
        self.held: Counter | None = None
        self.preemptions: Counter | None = None
        self.outcomes: dict[str, Counter] = {}


class SchedulerMetrics:
    """The scheduler's metrics; `serve(port)` exposes them over HTTP."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._define_timings(self.registry)
        self._define_group_series(self.registry)
        self._define_health(self.registry)
        self._holders: dict[str, str] = {}
        self.registry.register(_HolderCollector(self._holders))
        self._series: dict[str, _GroupSeries] = {}
        self._endpoint: MetricsEndpoint | None = None

    def _define_timings(self, r: CollectorRegistry) -> None:
        """How long acquires wait and switches take, and what they move."""
        self.acquire_wait = Histogram(
            "rlslice_scheduler_acquire_wait_seconds",
            "Seconds from Acquire to grant",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.switch_seconds = Histogram(
            "rlslice_scheduler_switch_seconds",
            "Seconds a switch took (snapshots and restore)",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.moved_bytes = Counter(
            "rlslice_scheduler_moved_bytes", "Device bytes moved by switches", registry=r
        )

    def _define_group_series(self, r: CollectorRegistry) -> None:
        """The per-group series (labelled by group, some by outcome)."""
        self.queue_depth = Gauge(
            "rlslice_scheduler_queue_depth", "Waiters per group", ["group"], registry=r
        )
        self.held_seconds = Counter(
            "rlslice_scheduler_held_seconds", "Seconds groups were held", ["group"], registry=r
        )
        self.switches = Counter(
            "rlslice_scheduler_switches",
            "Switches by outcome (done, failed, faulted)",
            ["group", "outcome"],
            registry=r,
        )
        self.preemptions = Counter(
            "rlslice_scheduler_preemptions", "Holders preempted", ["group"], registry=r
        )
        self.prefetches = Counter(
            "rlslice_scheduler_prefetches",
            "Waiters restored beside the holder ahead of their grant, by outcome (done, "
            "undone: parked again when the waiter left, skipped: no room, failed)",
            ["group", "outcome"],
            registry=r,
        )
        self.lock_only = Counter(
            "rlslice_scheduler_lock_only_registrations",
            "Jobs registered while no agent of their group knew them: they take turns on the "
            "lock, but their switches move nothing of them",
            ["group"],
            registry=r,
        )

    def _define_health(self, r: CollectorRegistry) -> None:
        """The store's health and what the scheduler knows of (groups, agents)."""
        self.store_refusals = Counter(
            "rlslice_scheduler_store_refusals",
            "Transitions refused (UNAVAILABLE) or retried because the store could not persist "
            "them; nothing is granted unpersisted",
            registry=r,
        )
        self.store_healthy = Gauge(
            "rlslice_scheduler_store_healthy",
            "1 while the store writes, 0 after a failed write until one succeeds again",
            registry=r,
        )
        self.store_healthy.set(1)
        self.groups = Gauge("rlslice_scheduler_groups", "Groups known", registry=r)
        self.agents = Gauge("rlslice_scheduler_agents", "Agents registered", registry=r)

    def watch_busy(self, source: Callable[[], Iterable[tuple[str, float]]]) -> None:
        """Report busy fractions from `source` (group, fraction) at every scrape."""
        self.registry.register(_BusyCollector(source))

    def _group(self, group: str) -> _GroupSeries:
        series = self._series.get(group)
        if series is None:
            series = self._series[group] = _GroupSeries()
        return series

    def set_holder(self, group: str, job: str | None) -> None:
        """Keep one holder series per group (none while the group is free)."""
        if job is None:
            self._holders.pop(group, None)
        else:
            self._holders[group] = job

    def holders(self) -> dict[str, str]:
        """Group -> current holder, as the holder series reports it."""
        return dict(self._holders)

    def set_queue_depth(self, group: str, depth: int) -> None:
        """Waiters of `group`."""
        series = self._group(group)
        if series.queue_depth is None:
            series.queue_depth = self.queue_depth.labels(group)
        series.queue_depth.set(depth)

    def add_held(self, group: str, seconds: float) -> None:
        """A hold of `group` ended after `seconds`."""
        series = self._group(group)
        if series.held is None:
            series.held = self.held_seconds.labels(group)
        series.held.inc(seconds)

    def count_lock_only(self, group: str) -> None:
        """A job registered in `group` that no agent of the group knows."""
        self.lock_only.labels(group).inc()

    def count_preemption(self, group: str) -> None:
        """A holder of `group` was preempted."""
        series = self._group(group)
        if series.preemptions is None:
            series.preemptions = self.preemptions.labels(group)
        series.preemptions.inc()

    def count_prefetch(self, group: str, outcome: str) -> None:
        """A prefetch of `group` ended: "done", "undone", "skipped" or "failed"."""
        self.prefetches.labels(group, outcome).inc()

    def count_switch(self, group: str, outcome: str) -> None:
        """A switch of `group` ended: "done", "failed" or "faulted"."""
        outcomes = self._group(group).outcomes
        child = outcomes.get(outcome)
        if child is None:
            child = outcomes[outcome] = self.switches.labels(group, outcome)
        child.inc()

    def forget_group(self, group: str) -> None:
        """Drop a deleted group's series (and the cached handles on them)."""
        self.set_holder(group, None)
        series = self._series.pop(group, None)
        for metric in (self.queue_depth, self.held_seconds, self.preemptions):
            try:
                metric.remove(group)
            except KeyError:
                pass
        for outcome in series.outcomes if series is not None else ():
            try:
                self.switches.remove(group, outcome)
            except KeyError:
                pass
        for outcome in ("done", "undone", "skipped", "failed"):
            try:
                self.prefetches.remove(group, outcome)
            except KeyError:
                pass

    def serve(self, address: str, port: int) -> int:
        """Serve /metrics over HTTP; return the bound port."""
        self._endpoint = serve_metrics(self.registry, address, port)
        return self._endpoint.port

    def close(self) -> None:
        """Stop the HTTP server."""
        if self._endpoint is not None:
            self._endpoint.close()
            self._endpoint = None
