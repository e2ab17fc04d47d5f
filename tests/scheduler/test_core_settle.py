"""What a switch's calls mean for the core (`core.settle`), as a table: plain outcomes in,
one event out.

| case | outcomes | undo | event |
|---|---|---|---|
| all went through | two nodes moved | - | SwitchDone, bytes and moves summed |
| a snapshot refused | n1 failed (snapshot), n2 went | switched back on 1 | SnapshotFailed, nobody unsure |
| a node cut off | n1 cut off mid-call | switched back on 1 | SnapshotFailed, n1's outgoing job unsure |
| a restore refused, undone | n1 failed (restore) | switched back on 0 | RestoreFailed, nothing evicted |
| a restore refused, undo failed | n1 failed (restore) | one job left parked | SnapshotFailed, that job unsure |
| a restore refused, not undone | serial restore failed | none | RestoreFailed, the plan's evicted parked |
| serial snapshot, rolled back | a call failed | rolled back on 2 | SnapshotFailed, reason says so |

And what a waiter is told for each kind of agent failure (`waiter_error`).
"""

from __future__ import annotations

import pytest

from rlslice._errors import (
    AbortedError,
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    NotFoundError,
    ResourceExhaustedError,
    RlsliceError,
    UnavailableError,
)
from rlslice.scheduler.core.events import (
    MoveKind,
    NodeMove,
    RestoreFailed,
    SnapshotFailed,
    SwitchDone,
)
from rlslice.scheduler.core.moves import MovePlan, NodeMoves
from rlslice.scheduler.core.settle import (
    CallFailure,
    NodeOutcome,
    Undo,
    UndoKind,
    settle,
    waiter_error,
)

PLAN = MovePlan(("a",), (NodeMoves("n1", ("a",), "b"), NodeMoves("n2", ("a",), "b")))
REFUSED = CallFailure("node n1: switch to job b: ABORTED: no room", AbortedError)
CUT = CallFailure("node n1: switch to job b: DEADLINE_EXCEEDED: late", DeadlineExceededError, True)
SHORT = CallFailure("node n1: restore of job b: RESOURCE_EXHAUSTED: full", ResourceExhaustedError)
SNAP_N1 = NodeMove("n1", "a", MoveKind.SNAPSHOT, 10, 0.1)
BACK_N1 = NodeMove("n1", "b", MoveKind.RESTORE, 7, 0.1)
SNAP_N2 = NodeMove("n2", "a", MoveKind.SNAPSHOT, 20, 0.2)
WENT_N1 = NodeOutcome("n1", 17, 7, ("a",), "b", done=(SNAP_N1, BACK_N1))
WENT_N2 = NodeOutcome("n2", 20, 0, ("a",), None, done=(SNAP_N2,))


@pytest.mark.parametrize(
    ("outcomes", "undo", "expected"),
    [
        pytest.param(
            [WENT_N1, WENT_N2],
            Undo(UndoKind.SWITCHED_BACK, 0),
            SwitchDone(3, ("a",), 37, restored_bytes=7, moves=(SNAP_N1, BACK_N1, SNAP_N2)),
            id="all went through",
        ),
        pytest.param(
            [NodeOutcome("n1", failure=REFUSED), WENT_N2],
            Undo(UndoKind.SWITCHED_BACK, 1),
            SnapshotFailed(3, f"{REFUSED} (switched back on 1 node(s))", FailedPreconditionError),
            id="a snapshot refused",
        ),
        pytest.param(
            [NodeOutcome("n1", failure=CUT, unsure=("a",)), WENT_N2],
            Undo(UndoKind.SWITCHED_BACK, 1),
            SnapshotFailed(3, f"{CUT} (switched back on 1 node(s))", AbortedError, ("a",)),
            id="a node cut off",
        ),
        pytest.param(
            [NodeOutcome("n1", failure=SHORT, failed_move=MoveKind.RESTORE)],
            Undo(UndoKind.SWITCHED_BACK, 0),
            RestoreFailed(3, str(SHORT), (), 0),
            id="a restore refused, undone",
        ),
        pytest.param(
            [NodeOutcome("n1", failure=SHORT, failed_move=MoveKind.RESTORE), WENT_N2],
            Undo(UndoKind.SWITCHED_BACK, 1, ("a",)),
            SnapshotFailed(
                3, f"{SHORT} (switched back on 1 node(s))", ResourceExhaustedError, ("a",)
            ),
            id="a restore refused, undo failed",
        ),
        pytest.param(
            [WENT_N2, NodeOutcome("n1", failure=SHORT, failed_move=MoveKind.RESTORE)],
            None,
            RestoreFailed(3, str(SHORT), ("a",), 20),
            id="a restore refused, not undone",
        ),
        pytest.param(
            [WENT_N2, NodeOutcome("n1", failure=CUT, unsure=("a",))],
            Undo(UndoKind.ROLLED_BACK, 2),
            SnapshotFailed(3, f"{CUT} (rolled back on 2 node(s))", AbortedError, ("a",)),
            id="serial snapshot, rolled back",
        ),
    ],
)
def test_the_calls_outcomes_settle_into_one_event(
    outcomes: list[NodeOutcome], undo: Undo | None, expected: object
) -> None:
    assert settle(3, PLAN, outcomes, undo) == expected


@pytest.mark.parametrize(
    ("error", "told"),
    [
        (UnavailableError, AbortedError),
        (DeadlineExceededError, AbortedError),
        (ResourceExhaustedError, ResourceExhaustedError),
        (AbortedError, FailedPreconditionError),
        (NotFoundError, FailedPreconditionError),
        (InternalError, FailedPreconditionError),
        (RlsliceError, FailedPreconditionError),
    ],
)
def test_a_waiter_is_told_aborted_for_an_unanswered_call_and_never_unavailable(
    error: type[RlsliceError], told: type[RlsliceError]
) -> None:
    assert waiter_error(error) is told
