"""Prometheus metrics of one agent, in a private registry (several agents may share a process)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from rlslice.snapshot_agent.backends.base import DeviceUsage
from rlslice.snapshot_agent.state import JobState

_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class AgentMetrics:
    """The agent's metrics; `registry` is what the HTTP endpoint serves."""

    def __init__(self, node: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._moves()
        self._memory()
        self._tiers()
        self.jobs = Gauge(
            "rlslice_agent_jobs", "Jobs on this node by state.", ["state"], registry=self.registry
        )
        self.info = Gauge(
            "rlslice_agent_info", "The agent's node.", ["node"], registry=self.registry
        )
        self.info.labels(node=node).set(1)
        for state in JobState:
            self.jobs.labels(state=state.value).set(0)
        for direction in ("out", "in"):
            self.moved_bytes.labels(direction=direction)

    def _moves(self) -> None:
        """What moves cost: seconds per snapshot and restore, bytes each way."""
        self.snapshot_seconds = Histogram(
            "rlslice_agent_snapshot_seconds",
            "Seconds a snapshot took on this node.",
            ["backend"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.restore_seconds = Histogram(
            "rlslice_agent_restore_seconds",
            "Seconds a restore took on this node.",
            ["backend"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.moved_bytes = Counter(
            "rlslice_agent_moved_bytes",
            "Bytes moved between device and host memory.",
            ["direction"],
            registry=self.registry,
        )

    def _memory(self) -> None:
        """Device and host memory: what is used, parked and pinned."""
        self.device_used = Gauge(
            "rlslice_agent_device_used_bytes",
            "Device memory in use.",
            ["device"],
            registry=self.registry,
        )
        self.device_total = Gauge(
            "rlslice_agent_device_total_bytes",
            "Device memory in total.",
            ["device"],
            registry=self.registry,
        )
        self.host_available = Gauge(
            "rlslice_agent_host_available_bytes",
            "Host memory available for parked state.",
            registry=self.registry,
        )
        self.parked_bytes = Gauge(
            "rlslice_agent_parked_bytes",
            "Host bytes taken by parked device state.",
            registry=self.registry,
        )
        self.pinned_bytes = Gauge(
            "rlslice_agent_pinned_bytes",
            "Pinned host bytes of staging on this node: the cuda backend's pinned pool "
            "(bounded by its pinned_pool_bytes option, counted by the host-memory guard) and "
            "what the app workloads hold (parked copies and the staging they keep).",
            registry=self.registry,
        )

    def _tiers(self) -> None:
        """The disk tier below host memory: parked bytes per tier, spill and fill costs."""
        self.tier_bytes = Gauge(
            "rlslice_agent_tier_bytes",
            "Parked bytes per tier: dram (host memory) or disk (the spill directory).",
            ["tier"],
            registry=self.registry,
        )
        self.spill_seconds = Histogram(
            "rlslice_agent_spill_seconds",
            "Seconds one parked part took to spill from host memory to disk.",
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.fill_seconds = Histogram(
            "rlslice_agent_fill_seconds",
            "Seconds one spilled part took to read back (verified) into host memory.",
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.tier_moved_bytes = Counter(
            "rlslice_agent_tier_moved_bytes",
            "Bytes moved between host memory and disk: spill (to disk), fill (back).",
            ["direction"],
            registry=self.registry,
        )
        for tier in ("dram", "disk"):
            self.tier_bytes.labels(tier=tier)
        for direction in ("spill", "fill"):
            self.tier_moved_bytes.labels(direction=direction)

    def observe_jobs(self, states: Iterable[JobState], parked_bytes: int) -> None:
        """Refresh the jobs-by-state and parked-bytes gauges."""
        counts = dict.fromkeys(JobState, 0)
        for state in states:
            counts[state] += 1
        for state, count in counts.items():
            self.jobs.labels(state=state.value).set(count)
        self.parked_bytes.set(parked_bytes)

    def observe_memory(self, devices: Iterable[DeviceUsage], host_available: int) -> None:
        """Refresh the device and host memory gauges."""
        for device in devices:
            self.device_used.labels(device=str(device.index)).set(device.used_bytes)
            self.device_total.labels(device=str(device.index)).set(device.total_bytes)
        self.host_available.set(host_available)
