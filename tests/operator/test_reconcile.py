"""Pure reconcile decisions and status rendering.

reconcile: (desired, observed) -> actions
  | scheduler lacks the group      -> put
  | scheduler has an older spec    -> put
  | scheduler has the same spec    -> nothing (idempotent, whatever the runtime state)
finalize: (observed, waited, timeout) -> actions
  | group gone                     -> nothing (finalizer may go)
  | no holder                      -> delete, not forced
  | holder, time left              -> retry later, naming the holder, never past the timeout
  | holder, timeout reached        -> delete, forced
status_for:
  | scheduler answered             -> every field mirrored, Ready True, observedGeneration set
  | scheduler unreachable          -> Ready Unknown, phase kept, observedGeneration kept
  | invalid spec                   -> Ready False InvalidSpec, phase Pending
  | scheduler says Degraded        -> Degraded True
  | condition unchanged            -> lastTransitionTime kept; changed -> now
  | deleting                       -> phase Deleting
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlslice.config import GroupSpec
from rlslice.operator.reconcile import (
    DeleteGroupAction,
    PutGroupAction,
    RetryLater,
    SchedulerView,
    finalize,
    reconcile,
    status_for,
)

SPEC = GroupSpec(name="rl-a", backend="sim")
NEWER = GroupSpec(name="rl-a", backend="sim", lease_seconds=10)


@pytest.mark.parametrize(
    ("observed", "expected"),
    [
        (None, (PutGroupAction(NEWER),)),
        (SchedulerView(spec=SPEC), (PutGroupAction(NEWER),)),
        (SchedulerView(spec=NEWER), ()),
        (SchedulerView(spec=NEWER, holder="a", queue=("b",), epoch=9), ()),
    ],
    ids=["missing", "older-spec", "same-spec", "same-spec-while-held"],
)
def test_reconcile_puts_the_group_only_when_the_scheduler_differs(
    observed: SchedulerView | None, expected: tuple[object, ...]
) -> None:
    assert reconcile(NEWER, observed) == expected


def test_reconcile_is_idempotent_once_its_put_is_applied() -> None:
    (action,) = reconcile(NEWER, None)
    assert isinstance(action, PutGroupAction)
    assert reconcile(NEWER, SchedulerView(spec=action.spec)) == ()


@pytest.mark.parametrize(
    ("observed", "waited", "expected"),
    [
        (None, 0.0, ()),
        (SchedulerView(spec=SPEC), 0.0, (DeleteGroupAction("rl-a", force=False),)),
        (SchedulerView(spec=SPEC, queue=("b",)), 0.0, (DeleteGroupAction("rl-a", force=False),)),
        (SchedulerView(spec=SPEC, holder="a"), 300.0, (DeleteGroupAction("rl-a", force=True),)),
        (SchedulerView(spec=SPEC, holder="a"), 999.0, (DeleteGroupAction("rl-a", force=True),)),
    ],
    ids=["gone", "idle", "waiters-only", "timeout", "past-timeout"],
)
def test_finalize_deletes_when_nobody_holds_or_the_timeout_passed(
    observed: SchedulerView | None, waited: float, expected: tuple[object, ...]
) -> None:
    assert finalize("rl-a", observed, waited_seconds=waited, timeout_seconds=300) == expected


@given(waited=st.floats(min_value=0, max_value=299.9), timeout=st.just(300.0))
def test_finalize_waits_for_a_holder_but_never_past_the_timeout(
    waited: float, timeout: float
) -> None:
    (action,) = finalize(
        "rl-a",
        SchedulerView(spec=SPEC, holder="trainer"),
        waited_seconds=waited,
        timeout_seconds=timeout,
    )
    assert isinstance(action, RetryLater)
    assert "trainer" in action.reason
    assert 0 < action.delay <= max(0.1, timeout - waited)


def _conditions(status: dict) -> dict[str, dict]:
    return {c["type"]: c for c in status["conditions"]}


def test_status_mirrors_the_scheduler_and_marks_the_generation_ready() -> None:
    view = SchedulerView(
        spec=SPEC,
        phase="Held",
        holder="a",
        queue=("b", "c"),
        resident=("a",),
        parked=("b",),
        nodes=("n1",),
        epoch=7,
        switches=3,
        busy_fraction=0.731234,
        last_switch_seconds=0.25,
    )
    status = status_for(SPEC, view, generation=4, now="2025-01-01T00:00:00Z")
    assert {k: v for k, v in status.items() if k != "conditions"} == {
        "phase": "Held",
        "holder": "a",
        "queue": ["b", "c"],
        "queueLength": 2,
        "resident": ["a"],
        "parked": ["b"],
        "nodes": ["n1"],
        "epoch": 7,
        "switches": 3,
        "busyFraction": 0.7312,
        "lastSwitchSeconds": 0.25,
        "observedGeneration": 4,
    }
    conditions = _conditions(status)
    assert conditions["Ready"]["status"] == "True"
    assert conditions["Ready"]["observedGeneration"] == 4
    assert conditions["Degraded"]["status"] == "False"


def test_an_unreachable_scheduler_keeps_what_was_known() -> None:
    previous = {"phase": "Held", "holder": "a", "observedGeneration": 3, "conditions": []}
    status = status_for(
        SPEC, None, generation=4, now="t2", previous=previous, error="scheduler: down"
    )
    assert status["phase"] == "Held"
    assert "holder" not in status  # a merge patch leaves the last known holder in place
    assert status["observedGeneration"] == 3
    assert _conditions(status)["Ready"]["status"] == "Unknown"
    assert _conditions(status)["Ready"]["message"] == "scheduler: down"


def test_an_invalid_spec_is_reported_and_not_ready() -> None:
    status = status_for(None, None, generation=2, now="t", invalid="spec.policy: bad")
    assert status["phase"] == "Pending"
    ready = _conditions(status)["Ready"]
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "False",
        "InvalidSpec",
        "spec.policy: bad",
    )
    assert "observedGeneration" not in status


def test_a_degraded_scheduler_phase_raises_the_degraded_condition() -> None:
    status = status_for(SPEC, SchedulerView(spec=SPEC, phase="Degraded"), generation=1, now="t")
    assert _conditions(status)["Degraded"]["status"] == "True"


def test_a_condition_keeps_its_transition_time_until_its_status_changes() -> None:
    first = status_for(SPEC, SchedulerView(spec=SPEC), generation=1, now="t1")
    same = status_for(SPEC, SchedulerView(spec=SPEC), generation=1, now="t2", previous=first)
    assert _conditions(same)["Ready"]["lastTransitionTime"] == "t1"
    changed = status_for(SPEC, None, generation=1, now="t3", previous=same, error="down")
    assert _conditions(changed)["Ready"]["lastTransitionTime"] == "t3"


def test_a_group_being_deleted_shows_deleting() -> None:
    status = status_for(SPEC, SchedulerView(spec=SPEC), generation=1, now="t", deleting=True)
    assert status["phase"] == "Deleting"


def test_a_group_missing_from_the_scheduler_is_pending_with_an_empty_table() -> None:
    status = status_for(SPEC, None, generation=1, now="t", previous={"holder": "a"})
    assert (status["phase"], status["holder"], status["queueLength"]) == ("Pending", "", 0)
    assert _conditions(status)["Ready"]["reason"] == "NotInScheduler"
