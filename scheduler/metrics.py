"""Prometheus metrics of one scheduler, in a private registry (tests run several at once).

No job ids as labels, except on `rlslice_scheduler_holder`, which has one series per
group (the current holder) and so stays bounded.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

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


class SchedulerMetrics:
    """The scheduler's metrics; `serve(port)` exposes them over HTTP."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
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
        self.holder = Gauge(
            "rlslice_scheduler_holder",
            "1 for the job holding each group",
            ["group", "job"],
            registry=r,
        )
        self.groups = Gauge("rlslice_scheduler_groups", "Groups known", registry=r)
        self.agents = Gauge("rlslice_scheduler_agents", "Agents registered", registry=r)
        self._holders: dict[str, str] = {}
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def watch_busy(self, source: Callable[[], Iterable[tuple[str, float]]]) -> None:
        """Report busy fractions from `source` (group, fraction) at every scrape."""
        self.registry.register(_BusyCollector(source))

    def set_holder(self, group: str, job: str | None) -> None:
        """Keep one holder series per group."""
        old = self._holders.get(group)
        if old == job:
            return
        if old is not None:
            self.holder.remove(group, old)
            del self._holders[group]
        if job is not None:
            self.holder.labels(group, job).set(1)
            self._holders[group] = job

    def forget_group(self, group: str) -> None:
        """Drop a deleted group's series."""
        self.set_holder(group, None)
        for gauge in (self.queue_depth, self.held_seconds, self.preemptions):
            try:
                gauge.remove(group)
            except KeyError:
                pass

    def serve(self, address: str, port: int) -> int:
        """Serve /metrics over HTTP; return the bound port."""
        server, thread = start_http_server(port, addr=address, registry=self.registry)
        self._server, self._thread = server, thread
        return int(server.server_port)

    def close(self) -> None:
        """Stop the HTTP server."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
