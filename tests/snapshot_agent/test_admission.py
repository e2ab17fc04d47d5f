"""Whether a move goes ahead, and which backend runs it: one rule for moves and switches.

Case matrix:
- state.admit: another group is refused naming both groups and the node, whatever the
  state; in the right group it answers as decide() for every case of the decide table
- moves.early_answer: absent and repeated replies, a refusal raised with its message, None
  to go ahead
- BackendRegistry: the backend serving a job (parked by, registered with, default); a
  restore goes back through the backend that parked it; names checked for registration
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlslice._errors import FailedPreconditionError, InvalidArgumentError
from rlslice.snapshot_agent.jobs import JobEntry
from rlslice.snapshot_agent.moves import MoveReply, early_answer
from rlslice.snapshot_agent.registry import BackendRegistry
from rlslice.snapshot_agent.state import (
    Absent,
    AgentJobRecord,
    JobState,
    Move,
    Proceed,
    Refusal,
    Refuse,
    Repeat,
    admit,
    begin,
    decide,
    fail,
    succeed,
)

RUNNING = AgentJobRecord(job="a", group="g")
PARKED = succeed(begin(RUNNING, Move.SNAPSHOT, 5, "sim"), Move.SNAPSHOT, 5, 100, 0.1)
FAULTED = fail(begin(PARKED, Move.RESTORE, 6, "sim"), Move.RESTORE, 6, "boom", 0.1)
RECORDS = st.sampled_from([None, RUNNING, PARKED, FAULTED, begin(RUNNING, Move.SNAPSHOT, 3, "")])


@given(RECORDS, st.sampled_from(Move), st.integers(0, 8), st.booleans())
def test_admit_in_the_jobs_own_group_answers_as_decide(
    record: AgentJobRecord | None, move: Move, epoch: int, has_processes: bool
) -> None:
    assert admit(record, move, epoch, group="g", node="n1", has_processes=has_processes) == decide(
        record, move, epoch, has_processes=has_processes
    )


@given(st.sampled_from([RUNNING, PARKED, FAULTED]), st.sampled_from(Move), st.integers(0, 8))
def test_admit_refuses_a_job_of_another_group_whatever_its_state(
    record: AgentJobRecord, move: Move, epoch: int
) -> None:
    decision = admit(record, move, epoch, group="other", node="n1", has_processes=True)
    assert decision == Refuse(
        Refusal.WRONG_GROUP, "group: job a is in group g on node n1, not other"
    )


def test_an_early_answer_of_absent_keeps_the_jobs_state_and_the_epoch() -> None:
    assert early_answer(Absent(), "a", RUNNING, 7) == MoveReply(
        "a", JobState.RUNNING, absent=True, epoch=7
    )
    assert early_answer(Absent(), "a", None, 7) == MoveReply("a", None, absent=True, epoch=7)


def test_an_early_answer_of_a_repeat_is_the_earlier_result_marked_repeated() -> None:
    assert PARKED.last is not None
    reply = early_answer(Repeat(PARKED.last), "a", PARKED, 5)
    assert reply == MoveReply("a", JobState.PARKED, 100, 0.1, True, False, 5, "sim")


def test_a_refusal_is_raised_with_its_message_and_proceed_has_no_early_answer() -> None:
    with pytest.raises(FailedPreconditionError, match=r"^job a is parked already$"):
        early_answer(Refuse(Refusal.NOT_ALLOWED, "job a is parked already"), "a", PARKED, 6)
    assert early_answer(Proceed(), "a", RUNNING, 6) is None


def registry(tmp_path: Path) -> BackendRegistry:
    return BackendRegistry(
        node="n1", state_dir=tmp_path, default="sim", options=lambda name: {}, entries={}
    )


def test_the_backend_serving_a_job_is_the_one_that_parked_it_else_its_own_else_the_default(
    tmp_path: Path,
) -> None:
    backends = registry(tmp_path)
    assert backends.serving(JobEntry(RUNNING)) == "sim"
    assert backends.serving(JobEntry(RUNNING, backend="app")) == "app"
    parked_by_cuda = begin(RUNNING, Move.SNAPSHOT, 1, "cuda")
    assert backends.serving(JobEntry(parked_by_cuda, backend="app")) == "cuda"


def test_a_restore_goes_back_through_the_backend_that_parked_the_job(tmp_path: Path) -> None:
    backends = registry(tmp_path)
    entry = JobEntry(begin(RUNNING, Move.SNAPSHOT, 1, "cuda"), backend="app")
    assert backends.for_move(entry, Move.RESTORE, "") == "cuda"
    assert backends.for_move(entry, Move.SNAPSHOT, "") == "app"
    assert backends.for_move(entry, Move.SNAPSHOT, "sim") == "sim"
    with pytest.raises(FailedPreconditionError, match="parked by 'cuda', not 'app'"):
        backends.for_move(entry, Move.RESTORE, "app")


def test_a_registration_names_an_installed_backend_and_a_move_a_well_formed_one(
    tmp_path: Path,
) -> None:
    backends = registry(tmp_path)
    backends.require_installed("")  # the default
    with pytest.raises(InvalidArgumentError, match="'sim' is not installed on this node"):
        backends.require_installed("sim")
    BackendRegistry.check_asked("")
    BackendRegistry.check_asked("not-installed-but-well-formed")
    with pytest.raises(InvalidArgumentError, match="backend"):
        BackendRegistry.check_asked("Bad Name!")
