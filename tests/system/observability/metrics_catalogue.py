"""The metrics rlslice exports: the one list the dashboard test and the docs test read.

name -> (type, labels). Base units, `_total` counters, bounded labels. A histogram named `x`
is queried as `x_bucket` (label `le`), `x_sum` and `x_count`. The scheduler and agent helpers
own the code that exports these; `docs/observability.md` lists the same names.
"""

from __future__ import annotations

SCHEDULER: dict[str, tuple[str, frozenset[str]]] = {
    "rlslice_scheduler_acquire_wait_seconds": ("histogram", frozenset()),
    "rlslice_scheduler_switch_seconds": ("histogram", frozenset()),
    "rlslice_scheduler_moved_bytes_total": ("counter", frozenset()),
    "rlslice_scheduler_queue_depth": ("gauge", frozenset({"group"})),
    "rlslice_scheduler_held_seconds_total": ("counter", frozenset({"group"})),
    "rlslice_scheduler_switches_total": ("counter", frozenset({"group", "outcome"})),
    "rlslice_scheduler_busy_fraction": ("gauge", frozenset({"group"})),
    "rlslice_scheduler_preemptions_total": ("counter", frozenset({"group"})),
    "rlslice_scheduler_prefetches_total": ("counter", frozenset({"group", "outcome"})),
    # One series per group (its current holder), so the job label stays bounded.
    "rlslice_scheduler_holder": ("gauge", frozenset({"group", "job"})),
    "rlslice_scheduler_groups": ("gauge", frozenset()),
    "rlslice_scheduler_agents": ("gauge", frozenset()),
    "rlslice_scheduler_lock_only_registrations_total": ("counter", frozenset({"group"})),
    "rlslice_scheduler_store_refusals_total": ("counter", frozenset()),
    "rlslice_scheduler_store_healthy": ("gauge", frozenset()),
}

AGENT: dict[str, tuple[str, frozenset[str]]] = {
    "rlslice_agent_snapshot_seconds": ("histogram", frozenset({"backend"})),
    "rlslice_agent_restore_seconds": ("histogram", frozenset({"backend"})),
    "rlslice_agent_moved_bytes_total": ("counter", frozenset({"direction"})),
    "rlslice_agent_jobs": ("gauge", frozenset({"state"})),
    "rlslice_agent_device_used_bytes": ("gauge", frozenset({"device"})),
    "rlslice_agent_device_total_bytes": ("gauge", frozenset({"device"})),
    "rlslice_agent_host_available_bytes": ("gauge", frozenset()),
    "rlslice_agent_parked_bytes": ("gauge", frozenset()),
    "rlslice_agent_pinned_bytes": ("gauge", frozenset()),
    # Always 1; joins a node name onto the agent's other series (`* on (instance) group_left (node)`).
    "rlslice_agent_info": ("gauge", frozenset({"node"})),
    # The disk tier below host memory (snapshot_agent/tiering.py).
    "rlslice_agent_tier_bytes": ("gauge", frozenset({"tier"})),
    "rlslice_agent_spill_seconds": ("histogram", frozenset()),
    "rlslice_agent_fill_seconds": ("histogram", frozenset()),
    "rlslice_agent_tier_moved_bytes_total": ("counter", frozenset({"direction"})),
}

METRICS: dict[str, tuple[str, frozenset[str]]] = {**SCHEDULER, **AGENT}

#: Labels Prometheus adds to every scraped series (the scrape target).
TARGET_LABELS = frozenset({"instance", "job"})

HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def base_name(series: str) -> str | None:
    """The catalogue name a series name belongs to (`x_bucket` -> `x`), None if none."""
    if series in METRICS:
        return series
    for suffix in HISTOGRAM_SUFFIXES:
        stem = series.removesuffix(suffix)
        if stem != series and METRICS.get(stem, ("", None))[0] == "histogram":
            return stem
    return None


def labels_of(series: str) -> frozenset[str]:
    """Labels a series may carry: its own, the target's, and `le` for histogram buckets.

    An own label named like a target label (the holder's `job`) is stored by Prometheus as
    `exported_<name>` (honor_labels false, the ServiceMonitor's default); both are listed.
    """
    name = base_name(series)
    if name is None:
        return frozenset()
    clashes = METRICS[name][1] & TARGET_LABELS
    own = METRICS[name][1] | TARGET_LABELS | {f"exported_{label}" for label in clashes}
    return own | {"le"} if series.endswith("_bucket") else own
