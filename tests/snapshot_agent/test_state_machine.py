"""The agent's per-job state machine (pure).

Case matrix:
- decide(): table of state x move x epoch x processes -> Proceed / Repeat / Absent / Refuse
- transitions: begin/succeed/fail land in the right state, faults are cleared by success
- recovered(): what an agent restart makes of each recorded state and backend answer
- to_dict/from_dict round-trip, a released record included
- released: a Release that keeps the job marks it, a dropped copy leaves it running and
  released, the next move clears the mark
- hypothesis: random sequences of moves keep the invariants (a repeat never acts, a
  refusal changes nothing, parked bytes only while the state is in host memory, epochs
  never go down)
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlslice.snapshot_agent.state import (
    Absent,
    AgentJobRecord,
    JobState,
    Move,
    Proceed,
    Refusal,
    Refuse,
    Repeat,
    begin,
    decide,
    fail,
    from_dict,
    recovered,
    release_kept,
    released_running,
    succeed,
    to_dict,
)

RUNNING = AgentJobRecord(job="a", group="g")
PARKED = succeed(begin(RUNNING, Move.SNAPSHOT, 5, "sim"), Move.SNAPSHOT, 5, 100, 0.1)
FAULTED_SNAPSHOT = fail(begin(RUNNING, Move.SNAPSHOT, 5, "sim"), Move.SNAPSHOT, 5, "boom", 0.1)
FAULTED_RESTORE = fail(begin(PARKED, Move.RESTORE, 6, "sim"), Move.RESTORE, 6, "boom", 0.1)


@pytest.mark.parametrize(
    ("record", "move", "epoch", "has_processes", "expected"),
    [
        (None, Move.SNAPSHOT, 1, True, Absent),
        (None, Move.RESTORE, 1, True, Absent),
        (RUNNING, Move.SNAPSHOT, 1, True, Proceed),
        (RUNNING, Move.SNAPSHOT, 1, False, Absent),
        (RUNNING, Move.RESTORE, 1, True, Refuse),
        (PARKED, Move.SNAPSHOT, 5, True, Repeat),
        (PARKED, Move.SNAPSHOT, 6, True, Refuse),
        (PARKED, Move.SNAPSHOT, 4, True, Refuse),
        (PARKED, Move.RESTORE, 5, True, Proceed),
        (PARKED, Move.RESTORE, 6, True, Proceed),
        (PARKED, Move.RESTORE, 4, True, Refuse),
        (PARKED, Move.RESTORE, 6, False, Refuse),
        (FAULTED_SNAPSHOT, Move.SNAPSHOT, 5, True, Proceed),
        (FAULTED_SNAPSHOT, Move.RESTORE, 5, True, Refuse),
        (FAULTED_RESTORE, Move.RESTORE, 6, True, Proceed),
        (FAULTED_RESTORE, Move.SNAPSHOT, 7, True, Refuse),
        (begin(RUNNING, Move.SNAPSHOT, 3, "sim"), Move.SNAPSHOT, 4, True, Refuse),
    ],
)
def test_decide_answers_each_state_as_the_table_says(
    record: AgentJobRecord | None, move: Move, epoch: int, has_processes: bool, expected: type
) -> None:
    assert isinstance(decide(record, move, epoch, has_processes=has_processes), expected)


def test_an_older_epoch_is_refused_as_stale_naming_both_epochs() -> None:
    decision = decide(PARKED, Move.RESTORE, 4, has_processes=True)
    assert isinstance(decision, Refuse)
    assert decision.why is Refusal.STALE
    assert "4" in decision.message
    assert "5" in decision.message


def test_a_repeat_returns_the_earlier_result_unchanged() -> None:
    decision = decide(PARKED, Move.SNAPSHOT, 5, has_processes=True)
    assert isinstance(decision, Repeat)
    assert decision.result == PARKED.last
    assert decision.result.bytes == 100


def test_a_rolled_back_snapshot_can_be_taken_again_in_the_same_epoch() -> None:
    # Snapshot(5) then a rollback Restore(5): a retried Snapshot(5) must act, not repeat.
    rolled_back = succeed(begin(PARKED, Move.RESTORE, 5, "sim"), Move.RESTORE, 5, 100, 0.1)
    assert isinstance(decide(rolled_back, Move.SNAPSHOT, 5, has_processes=True), Proceed)


def test_a_failed_move_is_faulted_with_its_reason_and_a_success_clears_it() -> None:
    assert FAULTED_SNAPSHOT.state is JobState.FAULTED
    assert FAULTED_SNAPSHOT.reason == "boom"
    assert FAULTED_SNAPSHOT.state_on_device
    retried = succeed(begin(FAULTED_SNAPSHOT, Move.SNAPSHOT, 5, "sim"), Move.SNAPSHOT, 5, 100, 0.2)
    assert retried.state is JobState.PARKED
    assert retried.reason == ""
    assert retried.faulted_in is None


def test_a_failed_restore_keeps_the_state_in_host_memory() -> None:
    assert FAULTED_RESTORE.state_in_host
    assert FAULTED_RESTORE.parked_bytes == 100


@pytest.mark.parametrize(
    ("record", "backend_says", "state"),
    [
        (RUNNING, "running", JobState.RUNNING),
        (PARKED, "parked", JobState.PARKED),
        (PARKED, "running", JobState.RUNNING),
        (RUNNING, "parked", JobState.PARKED),
        (begin(RUNNING, Move.SNAPSHOT, 3, "sim"), "running", JobState.RUNNING),
        (begin(RUNNING, Move.SNAPSHOT, 3, "sim"), "parked", JobState.PARKED),
        (begin(PARKED, Move.RESTORE, 6, "sim"), "parked", JobState.PARKED),
        (begin(PARKED, Move.RESTORE, 6, "sim"), "unknown", JobState.FAULTED),
        (PARKED, "failed", JobState.FAULTED),
        (PARKED, "unknown", JobState.PARKED),
    ],
)
def test_an_agent_restart_settles_each_state_by_the_backend(
    record: AgentJobRecord, backend_says: str, state: JobState
) -> None:
    assert recovered(record, backend_says).state is state


@pytest.mark.parametrize(
    "record", [RUNNING, PARKED, FAULTED_SNAPSHOT, FAULTED_RESTORE, release_kept(PARKED)]
)
def test_records_round_trip_through_their_json_form(record: AgentJobRecord) -> None:
    assert from_dict(to_dict(record)) == record


def test_a_kept_release_marks_the_record_and_the_next_move_clears_it() -> None:
    kept = release_kept(PARKED)
    assert kept.released
    assert kept.state is JobState.PARKED
    assert not begin(kept, Move.RESTORE, 6, "sim").released


def test_a_dropped_copy_leaves_the_job_running_released_and_with_nothing_parked() -> None:
    dropped = released_running(FAULTED_RESTORE)
    assert (dropped.state, dropped.parked_bytes, dropped.reason) == (JobState.RUNNING, 0, "")
    assert dropped.faulted_in is None
    assert dropped.released


# -- property: random sequences of requests and outcomes ---------------------------------

steps = st.lists(
    st.tuples(
        st.sampled_from(list(Move)),
        st.integers(min_value=0, max_value=8),
        st.booleans(),  # has processes
        st.booleans(),  # the backend succeeds
        st.integers(min_value=0, max_value=1000),  # bytes
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_random_move_sequences_keep_the_invariants(
    sequence: list[tuple[Move, int, bool, bool, int]],
) -> None:
    record = AgentJobRecord(job="a", group="g")
    for move, epoch, has_processes, works, nbytes in sequence:
        before = record
        decision = decide(record, move, epoch, has_processes=has_processes)
        if isinstance(decision, Proceed):
            assert epoch >= record.epoch
            running = begin(record, move, epoch, "sim")
            assert running.state in (JobState.SAVING, JobState.RESTORING)
            if works:
                record = succeed(running, move, epoch, nbytes, 0.0)
                expected = JobState.PARKED if move is Move.SNAPSHOT else JobState.RUNNING
                assert record.state is expected
                assert record.reason == ""
            else:
                record = fail(running, move, epoch, "failed", 0.0)
                assert record.state is JobState.FAULTED
                assert record.reason
            assert record.epoch == epoch
        else:
            # Nothing acts: a repeat, an absent job or a refusal leaves the record alone.
            assert record == before
            if isinstance(decision, Repeat):
                assert decision.result == record.last
                assert (decision.result.move, decision.result.epoch) == (move, epoch)
        assert record.epoch >= before.epoch
        assert record.state not in (JobState.SAVING, JobState.RESTORING)
        if not record.state_in_host:
            assert record.parked_bytes == 0 or record.state is JobState.FAULTED
        assert record.state_on_device != record.state_in_host


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([RUNNING, PARKED, FAULTED_SNAPSHOT, FAULTED_RESTORE]), st.integers(0, 9))
def test_the_same_move_twice_acts_at_most_once(record: AgentJobRecord, epoch: int) -> None:
    for move in Move:
        first = decide(record, move, epoch, has_processes=True)
        if not isinstance(first, Proceed):
            continue
        done = succeed(begin(record, move, epoch, "sim"), move, epoch, 10, 0.0)
        again = decide(done, move, epoch, has_processes=True)
        assert isinstance(again, Repeat)
        assert replace(again.result) == done.last
