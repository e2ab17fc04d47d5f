"""The job table is written once per unit of work, on the rollback path too.

Case matrix:
- JobTable.change: many changes, one write; an exception inside still writes; no change,
  no write
- the engine: a registration is one write; a move is two (begun, ended), and a move the
  backend fails writes its FAULTED record; a move refused for its options writes the record
  as it was; a release of a live job is one write
- the process source the engine was made with is asked before every move and switch
- the file: a released job stays released after a reload; a file of an older agent, with
  the flag beside the record, is read the same
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

from rlslice._errors import AbortedError, InvalidArgumentError
from rlslice.snapshot_agent.backends import BackendEntry
from rlslice.snapshot_agent.backends.base import (
    BackendBase,
    BackendContext,
    BackendError,
    BackendState,
    DeviceUsage,
    JobHandle,
    MoveOutcome,
    OptionsError,
    ProbeResult,
)
from rlslice.snapshot_agent.engine import AgentEngine, SwitchHalf
from rlslice.snapshot_agent.jobs import JobEntry, JobTable
from rlslice.snapshot_agent.metrics import AgentMetrics
from rlslice.snapshot_agent.processes import identify
from rlslice.snapshot_agent.state import AgentJobRecord, JobState, Move
from rlslice.snapshot_agent.table_file import LEGACY_FILE, TableFile


class ScriptedBackend(BackendBase):
    """A backend that moves nothing; `fail_with` makes the next moves raise it."""

    name: ClassVar[str] = "scripted"
    fail_with: ClassVar[Exception | None] = None

    def __init__(self, context: BackendContext) -> None:
        self.context = context

    async def probe(self) -> ProbeResult:
        return ProbeResult(True, "")

    async def device_bytes(self, job: JobHandle) -> int:
        return 0

    async def snapshot(self, job: JobHandle, *, deadline: float) -> MoveOutcome:
        if ScriptedBackend.fail_with is not None:
            raise ScriptedBackend.fail_with
        return MoveOutcome(100, 0.01)

    async def restore(self, job: JobHandle, *, deadline: float) -> MoveOutcome:
        return MoveOutcome(100, 0.01)

    async def state(self, job: JobHandle) -> BackendState:
        return BackendState.UNKNOWN

    async def release(self, job: JobHandle) -> int:
        return 0

    async def devices(self) -> Sequence[DeviceUsage]:
        return [DeviceUsage(0, 0, 1 << 30)]


class Writes:
    """Every write of a table: the jobs' states as written."""

    def __init__(self, table: JobTable, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: list[dict[str, str]] = []
        state_dir = table.path.parent
        original = table._write

        def write() -> None:
            before = TableFile(state_dir).read()
            original()
            after = TableFile(state_dir).read()
            if after is not None and after != before:
                jobs = json.loads(after)["jobs"]
                self.seen.append({j["record"]["job"]: j["record"]["state"] for j in jobs})

        monkeypatch.setattr(table, "_write", write)


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[AgentEngine]:
    ScriptedBackend.fail_with = None
    made = AgentEngine(
        node="n1",
        state_dir=tmp_path,
        default_backend="scripted",
        backend_options=lambda name: {},
        host_reserve_bytes=0,
        metrics=AgentMetrics("n1"),
        backends={"scripted": BackendEntry("scripted", ScriptedBackend)},
        host_memory=lambda: 1 << 40,
    )
    await made.start()
    yield made
    await made.close()


def register_self(engine: AgentEngine, job: str = "job-a") -> None:
    ref = identify(os.getpid())  # the backend is scripted: nothing is done to this process
    assert ref is not None
    engine.register(ref, job, "g1")


def test_a_unit_of_work_writes_the_table_once_however_many_changes_it_makes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = JobTable(tmp_path)
    writes = Writes(table, monkeypatch)
    with table.change():
        for job in ("a", "b", "c"):
            table.entries[job] = JobEntry(AgentJobRecord(job=job, group="g"))
    assert writes.seen == [{"a": "running", "b": "running", "c": "running"}]


def test_a_unit_that_ends_by_an_exception_still_writes_what_it_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = JobTable(tmp_path)
    writes = Writes(table, monkeypatch)

    def failing_unit() -> None:
        with table.change():
            table.entries["a"] = JobEntry(
                AgentJobRecord(job="a", group="g", state=JobState.FAULTED)
            )
            raise RuntimeError("the move failed")

    with pytest.raises(RuntimeError, match="the move failed"):
        failing_unit()
    assert writes.seen == [{"a": "faulted"}]
    reread = JobTable(tmp_path)
    reread.load()
    assert reread.entries["a"].record.state is JobState.FAULTED


@pytest.mark.parametrize("beside_the_record", [False, True])
def test_a_released_job_stays_released_after_a_reload(
    tmp_path: Path, beside_the_record: bool
) -> None:
    table = JobTable(tmp_path)
    with table.change():
        table.entries["a"] = JobEntry(AgentJobRecord(job="a", group="g", released=True))
    if beside_the_record:  # as an older agent wrote it: whole JSON in jobs.json
        data = json.loads(table.path.read_bytes().partition(b"\n")[2])
        data["jobs"][0]["released"] = data["jobs"][0]["record"].pop("released")
        table.path.unlink()
        (tmp_path / LEGACY_FILE).write_text(json.dumps(data))
    reread = JobTable(tmp_path)
    reread.load()
    assert reread.entries["a"].released


def test_a_unit_that_changes_nothing_does_not_rewrite_the_file(tmp_path: Path) -> None:
    table = JobTable(tmp_path)
    with table.change():
        table.entries["a"] = JobEntry(AgentJobRecord(job="a", group="g"))
    path = table.path
    path.write_text("left alone")
    with table.change():
        pass
    assert path.read_text() == "left alone"
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # nor the other slot


async def test_a_registration_writes_the_table_once(
    engine: AgentEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes = Writes(engine.table, monkeypatch)
    register_self(engine)
    assert writes.seen == [{"job-a": "running"}]


async def test_a_move_writes_the_table_when_it_begins_and_once_when_it_ends(
    engine: AgentEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    register_self(engine)
    writes = Writes(engine.table, monkeypatch)
    reply = await engine.move(Move.SNAPSHOT, "job-a", "g1", 1)
    assert reply.state is JobState.PARKED
    assert writes.seen == [{"job-a": "saving"}, {"job-a": "parked"}]


async def test_a_move_the_backend_fails_writes_the_faulted_record(
    engine: AgentEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    register_self(engine)
    writes = Writes(engine.table, monkeypatch)
    ScriptedBackend.fail_with = BackendError("copy failed")
    with pytest.raises(AbortedError, match="copy failed"):
        await engine.move(Move.SNAPSHOT, "job-a", "g1", 1)
    assert writes.seen == [{"job-a": "saving"}, {"job-a": "faulted"}]


async def test_a_move_refused_for_its_options_writes_the_record_back_as_it_was(
    engine: AgentEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    register_self(engine)
    writes = Writes(engine.table, monkeypatch)
    ScriptedBackend.fail_with = OptionsError("unknown option")
    with pytest.raises(InvalidArgumentError, match="options: unknown option"):
        await engine.move(Move.SNAPSHOT, "job-a", "g1", 1)
    assert writes.seen == [{"job-a": "saving"}, {"job-a": "running"}]
    record = engine.table.entries["job-a"].record
    assert (record.state, record.epoch, record.last) == (JobState.RUNNING, 0, None)


async def test_a_release_of_a_live_job_writes_the_table_once(
    engine: AgentEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    register_self(engine)
    seen: list[Any] = []
    original = engine.table._write
    monkeypatch.setattr(engine.table, "_write", lambda: (seen.append(1), original()))
    assert await engine.release("job-a", "g1", force=False) == (0, False)
    assert seen == [1]
    assert engine.table.entries["job-a"].released


class CountingSource:
    """A process source that counts how often it is asked."""

    def __init__(self) -> None:
        self.asked = 0

    async def rediscover(self) -> None:
        self.asked += 1


async def test_the_process_source_is_asked_before_every_move_and_switch(tmp_path: Path) -> None:
    ScriptedBackend.fail_with = None
    source = CountingSource()
    made = AgentEngine(
        node="n1",
        state_dir=tmp_path,
        default_backend="scripted",
        backend_options=lambda name: {},
        host_reserve_bytes=0,
        metrics=AgentMetrics("n1"),
        backends={"scripted": BackendEntry("scripted", ScriptedBackend)},
        host_memory=lambda: 1 << 40,
        processes=source,
    )
    await made.start()
    try:
        register_self(made)
        parked = await made.move(Move.SNAPSHOT, "job-a", "g1", 1)
        back = await made.switch("g1", 2, (), SwitchHalf("job-a"))
    finally:
        await made.close()
    assert parked.state is JobState.PARKED
    assert back.incoming is not None
    assert back.incoming.state is JobState.RUNNING
    assert source.asked == 2
