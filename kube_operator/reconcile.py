"""What the operator does about a TimeSliceGroup: pure decisions over plain values.

`reconcile()` compares the spec the resource asks for with what the scheduler has and
returns the actions that close the gap (nothing when they agree, so it is idempotent).
`finalize()` decides, while the resource is being deleted, whether to delete the group
now, wait for its holder to yield, or force the deletion after the timeout.
`status_for()` renders the resource's status from the scheduler's view, keeping each
condition's lastTransitionTime while its status stays the same.

No kopf, grpc or kubernetes here: the handlers translate these actions into calls.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlslice.config import GroupSpec


class GroupPhase(enum.StrEnum):
    """A TimeSliceGroup's `.status.phase` (the values the CRD's description lists)."""

    PENDING = "Pending"
    """The scheduler has not reported the group (not put there yet, or the spec is invalid)."""
    IDLE = "Idle"
    HELD = "Held"
    SWITCHING = "Switching"
    DEGRADED = "Degraded"
    """Some job of the group is FAULTED."""
    DELETING = "Deleting"


#: The phases the scheduler itself reports (GroupStatus.phase); the operator adds the rest.
SCHEDULER_PHASES = tuple(
    p.value for p in (GroupPhase.IDLE, GroupPhase.HELD, GroupPhase.SWITCHING, GroupPhase.DEGRADED)
)


@dataclass(frozen=True)
class SchedulerView:
    """What the scheduler says about one group (its GetGroup answer, as plain values)."""

    spec: GroupSpec
    phase: str = GroupPhase.IDLE.value
    """As the scheduler says it (a `SCHEDULER_PHASES` value, unless a newer scheduler adds one)."""
    holder: str = ""
    queue: tuple[str, ...] = ()
    resident: tuple[str, ...] = ()
    parked: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    epoch: int = 0
    switches: int = 0
    busy_fraction: float = 0.0
    last_switch_seconds: float = 0.0


@dataclass(frozen=True)
class PutGroupAction:
    """Create or replace the group in the scheduler."""

    spec: GroupSpec


@dataclass(frozen=True)
class DeleteGroupAction:
    """Delete the group from the scheduler; `force` fails its holder and waiters."""

    name: str
    force: bool


@dataclass(frozen=True)
class RetryLater:
    """Nothing to do yet: look again after `delay` seconds."""

    reason: str
    delay: float


Action = PutGroupAction | DeleteGroupAction | RetryLater


def reconcile(desired: GroupSpec, observed: SchedulerView | None) -> tuple[Action, ...]:
    """Actions that make the scheduler hold `desired`; empty when it already does.

    `observed` is None when the scheduler does not know the group (never put, or lost by a
    scheduler restart without a persistent store).
    """
    if observed is None or observed.spec != desired:
        return (PutGroupAction(desired),)
    return ()


def finalize(
    name: str,
    observed: SchedulerView | None,
    *,
    waited_seconds: float,
    timeout_seconds: float,
    poll_seconds: float = 5.0,
) -> tuple[Action, ...]:
    """Actions for a TimeSliceGroup being deleted, `waited_seconds` after deletion began.

    The group goes once nobody holds it; a holder gets `timeout_seconds` to yield, then the
    deletion is forced (the holder and any waiters fail with a reason, nothing hangs).
    Empty when the scheduler no longer has the group: the finalizer may go.
    """
    if observed is None:
        return ()
    if not observed.holder:
        return (DeleteGroupAction(name, force=False),)
    remaining = timeout_seconds - waited_seconds
    if remaining <= 0:
        return (DeleteGroupAction(name, force=True),)
    return (
        RetryLater(
            f"waiting for holder {observed.holder!r} to yield "
            f"({remaining:.0f}s left before the deletion is forced)",
            delay=max(0.1, min(poll_seconds, remaining)),
        ),
    )


@dataclass(frozen=True)
class Condition:
    """One status condition."""

    type: str
    status: str
    reason: str
    message: str


def conditions_for(
    desired: GroupSpec | None,
    observed: SchedulerView | None,
    *,
    error: str | None = None,
    invalid: str | None = None,
) -> tuple[Condition, Condition]:
    """Ready and Degraded for a group.

    `invalid` is the message of a spec the operator refused; `error` is why the scheduler
    could not be asked (unreachable, refused).
    """
    if invalid is not None:
        ready = Condition("Ready", "False", "InvalidSpec", invalid)
    elif error is not None:
        ready = Condition("Ready", "Unknown", "SchedulerUnavailable", error)
    elif observed is None:
        ready = Condition("Ready", "False", "NotInScheduler", "the scheduler does not have it")
    elif desired is not None and observed.spec != desired:
        ready = Condition("Ready", "False", "Reconciling", "the scheduler has an older spec")
    else:
        ready = Condition("Ready", "True", "InScheduler", "the scheduler has the current spec")
    if observed is not None and observed.phase == GroupPhase.DEGRADED:
        degraded = Condition("Degraded", "True", "SchedulerDegraded", "the scheduler says so")
    elif error is not None:
        degraded = Condition("Degraded", "Unknown", "SchedulerUnavailable", error)
    else:
        degraded = Condition("Degraded", "False", "AsExpected", "")
    return ready, degraded


def status_for(
    desired: GroupSpec | None,
    observed: SchedulerView | None,
    *,
    generation: int,
    now: str,
    previous: Mapping[str, Any] | None = None,
    error: str | None = None,
    invalid: str | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    """The resource's `.status` (a full replacement of the fields we own).

    `now` is an RFC 3339 timestamp; `previous` the current `.status`, whose conditions keep
    their lastTransitionTime while their status does not change. Fields the scheduler did
    could not answer keep their previous values (an outage does not blank the table).
    """
    previous = previous or {}
    # Plain strings in the status (its YAML and JSON forms), each a GroupPhase value.
    status: dict[str, Any] = {}
    if observed is not None:
        status.update(
            phase=observed.phase if observed.phase in SCHEDULER_PHASES else GroupPhase.IDLE.value,
            holder=observed.holder,
            queue=list(observed.queue),
            queueLength=len(observed.queue),
            resident=list(observed.resident),
            parked=list(observed.parked),
            nodes=list(observed.nodes),
            epoch=observed.epoch,
            switches=observed.switches,
            busyFraction=round(min(1.0, max(0.0, observed.busy_fraction)), 4),
            lastSwitchSeconds=round(max(0.0, observed.last_switch_seconds), 6),
        )
    elif error is not None:
        # The scheduler could not be asked: keep what was last known (a merge patch leaves
        # the other fields as they are) rather than blanking the table during an outage.
        status["phase"] = previous.get("phase") or GroupPhase.PENDING.value
    else:
        status.update(
            phase=GroupPhase.PENDING.value,
            holder="",
            queue=[],
            queueLength=0,
            resident=[],
            parked=[],
        )
    if deleting:
        status["phase"] = GroupPhase.DELETING.value
    ready, degraded = conditions_for(desired, observed, error=error, invalid=invalid)
    if ready.status == "True":
        status["observedGeneration"] = generation
    elif "observedGeneration" in previous:
        status["observedGeneration"] = previous["observedGeneration"]
    status["conditions"] = [
        _condition_dict(condition, generation, now, previous.get("conditions") or ())
        for condition in (ready, degraded)
    ]
    return status


def _condition_dict(
    condition: Condition, generation: int, now: str, previous: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    since = now
    for old in previous:
        if old.get("type") == condition.type and old.get("status") == condition.status:
            since = str(old.get("lastTransitionTime") or now)
    return {
        "type": condition.type,
        "status": condition.status,
        "reason": condition.reason,
        "message": condition.message[:32768],
        "lastTransitionTime": since,
        "observedGeneration": generation,
    }
