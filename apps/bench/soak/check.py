"""Check a soak's event log against the DESIGN.md invariants. Pure: events in, a report out.

Events are dicts with `t` (a monotonic clock all processes share), `ev`, and for job
events `job` and `group`. What is checked:

- **one holder**: per group, a job's hold runs from `granted` to its `yield` (or to the
  moment the job was killed, or began `closing` its client), as its client saw it; holds of
  different jobs never overlap. A hold whose lock was lost (its `yield` failed: the lease
  lapsed, a partition) may overlap a later one only if the later grant carries a higher
  epoch (the fencing token): counted `fenced`, not a violation (the scheduler froze it);
- **every acquire answered**: each `acquire` is followed, in its job's own events, by
  `granted`, `acquire_failed` (a reason) or `acquire_cancelled` (the job gave up), unless
  the job was killed while waiting;
- **bytes intact**: every `checked` (the worker's sha256 after a grant, against the one it
  had when the job let go) is ok;
- **epochs rise**: per group, grants in time order carry strictly increasing epochs;
- **no job stuck or crashed**: every job that was not killed logged `stopped`, and none
  logged `crashed` (an error the driver did not expect: its worker failed, say).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

Event = Mapping[str, Any]
Hold = list[Any]
"""[start, end, job, epoch, lost]: one client-observed hold of a group."""
#: Errors of a yield that find the lock lost already (the lease lapsed meanwhile).
_LOST = frozenset({"NotFoundError", "PermissionDeniedError", "LockLostError"})


@dataclass
class SoakReport:
    """Figures and violations of one soak."""

    violations: list[str] = field(default_factory=list)
    grants: int = 0
    switches: int = 0
    """Grants that moved device state (a snapshot, a restore, or both; a prefetched
    restore, done before the grant, counts)."""
    restored: int = 0
    checks: int = 0
    acquire_failures: Counter[str] = field(default_factory=Counter)
    partitions: int = 0
    fenced: int = 0
    """Overlaps of a hold whose lock was lost with a later grant of a higher epoch."""
    lost: int = 0
    """Holds that ended with the lock lost (a yield refused: the lease had lapsed)."""
    faults: Counter[str] = field(default_factory=Counter)
    restarts: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {
            "grants": self.grants,
            "switches": self.switches,
            "restored": self.restored,
            "hash_checks": self.checks,
            "kills": dict(self.faults),
            "kills_total": sum(self.faults.values()),
            "restarts": dict(self.restarts),
            "restarts_total": sum(self.restarts.values()),
            "acquire_failures": dict(self.acquire_failures),
            "partitions": self.partitions,
            "locks_lost": self.lost,
            "fenced": self.fenced,
            "violations": len(self.violations),
            "violation_details": self.violations[:50],
        }


def check(events: Iterable[Event]) -> SoakReport:
    """The report of a soak's events (in any order; they are sorted by time)."""
    ordered = sorted(events, key=lambda e: float(e["t"]))
    report = SoakReport()
    by_job: dict[str, list[Event]] = defaultdict(list)
    killed: dict[str, float] = {}
    for event in ordered:
        kind = event["ev"]
        if kind == "fault" and event["kind"] == "partition":
            report.partitions += 1
        elif kind == "fault":
            report.faults[str(event["kind"])] += 1
            if event["kind"] == "job":
                killed[str(event["target"])] = float(event["t"])
        elif kind == "restarted":
            report.restarts[str(event["kind"])] += 1
        elif "job" in event:
            by_job[str(event["job"])].append(event)
    holds: dict[str, list[Hold]] = defaultdict(list)
    for job, mine in by_job.items():
        _check_job(job, mine, killed.get(job), report, holds)
    for group, spans in holds.items():
        _check_group(group, spans, report)
    return report


def _check_job(
    job: str,
    events: list[Event],
    killed_at: float | None,
    report: SoakReport,
    holds: dict[str, list[Hold]],
) -> None:
    open_acquire: Event | None = None
    granted: Event | None = None
    last: Hold | None = None
    end = killed_at if killed_at is not None else float("inf")
    for event in events:
        kind = event["ev"]
        if kind == "acquire":
            if open_acquire is not None:
                report.violations.append(f"{job}: acquire at {event['t']:.3f} before an answer")
            open_acquire = event
        elif kind in ("granted", "acquire_failed", "acquire_cancelled"):
            open_acquire = None
            if kind == "acquire_failed":
                report.acquire_failures[str(event.get("kind", "?"))] += 1
            if kind == "granted":
                report.grants += 1
                # A prefetched grant moves nothing at the grant, yet its job was restored.
                report.switches += int(event.get("moved", 0)) > 0 or bool(event.get("restored"))
                report.restored += bool(event.get("restored"))
                granted = event
        elif kind == "checked":
            report.checks += 1
            if not event.get("ok"):
                report.violations.append(
                    f"{job}: device bytes changed while parked (at {event['t']:.3f})"
                )
        elif kind == "worker_stuck":
            report.violations.append(
                f"{job}: its worker did not exit after the job ended (state {event.get('state')})"
            )
        elif kind == "crashed":
            report.violations.append(f"{job}: crashed: {event.get('error', '?')}")
        elif kind == "yield_failed" and last is not None and event.get("kind") in _LOST:
            last[4] = True  # the lease had lapsed: the lock was lost during that hold
            report.lost += 1
        elif kind in ("yield", "closing", "stopped") and granted is not None:
            group = str(granted["group"])
            last = [float(granted["t"]), float(event["t"]), job, _epoch(granted), False]
            holds[group].append(last)
            granted = None
    if granted is not None:  # held until it was killed
        holds[str(granted["group"])].append([float(granted["t"]), end, job, _epoch(granted), False])
    if open_acquire is not None and killed_at is None:
        report.violations.append(f"{job}: acquire at {open_acquire['t']:.3f} never answered")
    if killed_at is None and not any(e["ev"] == "stopped" for e in events):
        report.violations.append(f"{job}: never stopped (stuck)")


def _epoch(event: Event) -> int:
    return int(event.get("epoch", 0))


def _check_group(group: str, spans: list[Hold], report: SoakReport) -> None:
    spans.sort(key=lambda span: (span[0], span[1]))
    latest: Hold | None = None  # the hold that ends last so far
    previous: Hold | None = None
    for span in spans:
        start, _, job, epoch, _ = span
        if latest is not None and start < latest[1] and latest[2] != job:
            if latest[4] and epoch > latest[3]:
                report.fenced += 1  # a lost lock, fenced before this grant
            else:
                report.violations.append(
                    f"{group}: two holders: {latest[2]} [{latest[0]:.3f}, {latest[1]:.3f}] "
                    f"and {job} from {start:.3f}"
                )
        if previous is not None and epoch <= previous[3]:
            report.violations.append(
                f"{group}: epoch did not rise: {previous[2]} {previous[3]} then {job} {epoch}"
            )
        if latest is None or span[1] > latest[1]:
            latest = span
        previous = span
