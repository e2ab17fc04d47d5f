"""Figures of `rlslice bench scale`, pure: percentiles, the phase plan, per-round results,
the choice of the best round and the verdict against the issue's targets."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rlslice.planner import stats

P99_RATIO_TARGET = 2.0
RSS_TARGET_MIB = 200.0
DEMAND = 0.5  # each group held about half the time


def parse_groups(text: str) -> list[int]:
    """`"10,1000"` -> `[10, 1000]`; ValueError naming `--groups` otherwise."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--groups: {text!r} is not a comma-separated list of integers") from None
    if not counts or any(n < 1 for n in counts):
        raise ValueError("--groups: every count must be 1 or more")
    return counts


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (`q` in 0..100) of `values`; 0.0 for no values."""
    return stats.percentile(values, q, method="nearest-rank")


@dataclass(frozen=True)
class PhasePlan:
    """Mean phase lengths that offer `rate` acquires/s over `groups` groups of `jobs` jobs."""

    cycle: float
    """Mean seconds between one job's acquires."""
    hold: float
    """Mean seconds a job holds (its GPU phase)."""

    @property
    def cpu(self) -> float:
        return self.cycle - self.hold


def plan(groups: int, jobs: int, rate: float, demand: float = DEMAND) -> PhasePlan:
    """Each job acquires once per `cycle`; a group is wanted `demand` of the time."""
    cycle = groups * jobs / rate
    return PhasePlan(cycle=cycle, hold=demand * cycle / jobs)


@dataclass
class Samples:
    """What the driver measured, in seconds."""

    overhead: list[float] = field(default_factory=list)
    immediate: list[float] = field(default_factory=list)
    """Round trips of grants answered without queueing or a switch (waited_seconds == 0)."""
    yields: list[float] = field(default_factory=list)
    probes: list[float] = field(default_factory=list)
    waited: list[float] = field(default_factory=list)
    errors: int = 0


@dataclass
class Result:
    """One configuration's figures (milliseconds, seconds, MiB as the names say)."""

    groups: int
    jobs: int
    seconds: float
    acquires: int
    yields: int
    errors: int
    overhead_p50_ms: float
    overhead_p99_ms: float
    immediate_share: float
    """Share of acquires granted at once (no queue, no switch: the job was resident)."""
    immediate_p50_ms: float
    immediate_p99_ms: float
    yield_p50_ms: float
    yield_p99_ms: float
    probe_p50_ms: float
    probe_p99_ms: float
    wait_p50_ms: float
    register_seconds: float
    scheduler_cpu_seconds: float
    scheduler_cpu_us_per_call: float
    scheduler_rss_idle_mib: float
    scheduler_rss_mib: float
    scheduler_peak_rss_mib: float
    events_kept: int = 0
    """Events in the scheduler's rings at the end (GetEvents over every group)."""
    events_kept_max: int = 0
    """Events the rings hold when full: groups × event_ring_size."""
    rss_bytes_per_event: float = 0.0
    """Scheduler RSS growth over the run / events added to the rings (an estimate)."""
    projected_full_ring_rss_mib: float = 0.0
    """RSS at the end plus the remaining ring room at `rss_bytes_per_event`: where a
    long-running scheduler with these groups settles (an estimate, not a measurement)."""
    driver_loop_lag_max_ms: float = 0.0
    """The driver's own stalls (its event loop, its GC): noise in the client-side figures."""
    driver_gc_full_pause_max_ms: float = 0.0
    overhead_p99_rounds_ms: tuple[float, ...] = ()
    """The p99 overhead of every round (the figures above are the best round's)."""
    loop_lag_p99_ms: float = 0.0
    """The scheduler's event loop: how late a 10 ms timer fired (p99, max)."""
    loop_lag_max_ms: float = 0.0
    gc_full_collections: float = 0.0
    """Full (generation 2) garbage collections in the scheduler, and the longest pause."""
    gc_full_pause_max_ms: float = 0.0
    gc_young_pause_max_ms: float = 0.0
    gc_tracked_objects: float = 0.0
    """Objects the collector tracks in the scheduler at the end (what a full GC walks)."""


def summarise(
    groups: int,
    jobs: int,
    seconds: float,
    samples: Samples,
    *,
    register_seconds: float,
    cpu_seconds: float,
    rss_idle: int,
    rss: int,
    peak_rss: int,
    driver: dict[str, float] | None = None,
    events: tuple[int, int, int] = (0, 0, 0),
) -> Result:
    """Figures from raw samples (pure). `events`: events the scheduler kept after
    registration, at the end, and at most (every group's ring full)."""
    ms = 1000.0
    calls = len(samples.overhead) + len(samples.yields)
    kept_idle, kept_end, kept_max = events
    grown = kept_end - kept_idle
    per_event = max(0, rss - rss_idle) / grown if grown > 0 else 0.0
    return Result(
        groups=groups,
        jobs=jobs,
        seconds=seconds,
        acquires=len(samples.overhead),
        yields=len(samples.yields),
        errors=samples.errors,
        overhead_p50_ms=percentile(samples.overhead, 50) * ms,
        overhead_p99_ms=percentile(samples.overhead, 99) * ms,
        immediate_share=len(samples.immediate) / len(samples.overhead) if samples.overhead else 0.0,
        immediate_p50_ms=percentile(samples.immediate, 50) * ms,
        immediate_p99_ms=percentile(samples.immediate, 99) * ms,
        yield_p50_ms=percentile(samples.yields, 50) * ms,
        yield_p99_ms=percentile(samples.yields, 99) * ms,
        probe_p50_ms=percentile(samples.probes, 50) * ms,
        probe_p99_ms=percentile(samples.probes, 99) * ms,
        wait_p50_ms=percentile(samples.waited, 50) * ms,
        register_seconds=register_seconds,
        scheduler_cpu_seconds=cpu_seconds,
        scheduler_cpu_us_per_call=cpu_seconds / calls * 1e6 if calls else 0.0,
        scheduler_rss_idle_mib=rss_idle / 2**20,
        scheduler_rss_mib=rss / 2**20,
        scheduler_peak_rss_mib=peak_rss / 2**20,
        events_kept=kept_end,
        events_kept_max=kept_max,
        rss_bytes_per_event=per_event,
        projected_full_ring_rss_mib=(rss + max(0, kept_max - kept_end) * per_event) / 2**20,
        driver_loop_lag_max_ms=(driver or {}).get("loop_lag_max_ms", 0.0),
        driver_gc_full_pause_max_ms=(driver or {}).get("gc_full_pause_max_ms", 0.0),
    )


def with_stalls(result: Result, stalls: Mapping[str, float]) -> Result:
    """`result` with the scheduler's stall figures (what its process printed at the end)."""
    return replace(
        result,
        loop_lag_p99_ms=stalls.get("loop_lag_p99_ms", 0.0),
        loop_lag_max_ms=stalls.get("loop_lag_max_ms", 0.0),
        gc_full_collections=stalls.get("gc_full_collections", 0.0),
        gc_full_pause_max_ms=stalls.get("gc_full_pause_max_ms", 0.0),
        gc_young_pause_max_ms=stalls.get("gc_young_pause_max_ms", 0.0),
        gc_tracked_objects=stalls.get("gc_tracked_objects", 0.0),
    )


def best_round(rounds: Sequence[Result]) -> Result:
    """The round with the lowest p99 overhead, carrying every round's p99 and the highest
    peak RSS (memory is not a noise to pick the best of)."""
    best = min(rounds, key=lambda r: r.overhead_p99_ms)
    return replace(
        best,
        overhead_p99_rounds_ms=tuple(r.overhead_p99_ms for r in rounds),
        scheduler_peak_rss_mib=max(r.scheduler_peak_rss_mib for r in rounds),
    )


def verdict(results: Sequence[Result]) -> dict[str, Any]:
    """Targets against the figures: the p99 ratio (largest count / first) and the largest RSS."""
    base, top = results[0], max(results, key=lambda r: r.groups)
    ratio = top.overhead_p99_ms / base.overhead_p99_ms if base.overhead_p99_ms > 0 else 0.0
    rss = max(r.scheduler_peak_rss_mib for r in results)
    return {
        "p99_overhead_ratio": ratio,
        "p99_overhead_ratio_target": P99_RATIO_TARGET,
        "p99_overhead_ratio_met": ratio <= P99_RATIO_TARGET,
        "peak_rss_mib": rss,
        "rss_target_mib": RSS_TARGET_MIB,
        "rss_met": rss <= RSS_TARGET_MIB,
    }
