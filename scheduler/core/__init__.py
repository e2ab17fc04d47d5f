"""The scheduler's pure core: group state as frozen values, events in, actions out.

No grpc, no I/O, no clock: `step(state, event, now)` is a plain function, so property tests
run hours of simulated time in milliseconds. The service and the coordinator translate.
"""

from rlslice.scheduler.core import actions, events
from rlslice.scheduler.core.deadlock import Deadlock, WaitEdge, closing_cycle
from rlslice.scheduler.core.machine import (
    MAX_SWITCH_ATTEMPTS,
    Transition,
    deadline,
    keepalive_answer,
    new_group,
    step,
)
from rlslice.scheduler.core.placement import Location, Placement, PlacementMap
from rlslice.scheduler.core.policies import AGING_PER_SECOND, order, pick, pick_next
from rlslice.scheduler.core.residency import NodeMemory, choose_evictions, fits
from rlslice.scheduler.core.state import GroupState, JobRecord, Switch, SwitchKind, Waiter
from rlslice.scheduler.core.yields import YieldReason, early_yield_for, yield_reason

__all__ = [
    "AGING_PER_SECOND",
    "MAX_SWITCH_ATTEMPTS",
    "Deadlock",
    "GroupState",
    "JobRecord",
    "Location",
    "NodeMemory",
    "Placement",
    "PlacementMap",
    "Switch",
    "SwitchKind",
    "Transition",
    "WaitEdge",
    "Waiter",
    "YieldReason",
    "actions",
    "choose_evictions",
    "closing_cycle",
    "deadline",
    "early_yield_for",
    "events",
    "fits",
    "keepalive_answer",
    "new_group",
    "order",
    "pick",
    "pick_next",
    "step",
    "yield_reason",
]
