"""One node's half of an overlapped switch (Agent.Switch) on the `sim` backend, with real
job processes really frozen.

Case matrix:
- a full device: the incoming job's bytes are admitted as the outgoing job's leave
  (overlapped), never above capacity; the outgoing job is frozen and parked, the incoming
  one runs with its bytes identical; a repeat with the same epoch is answered from memory
- a failed restore half (its buffer gone): both halves undone, the outgoing job runs on
  with its bytes, the incoming one stays parked; `failure` names the restore
- a half cut off by the call's deadline mid-copy: both undone, both copies whole
- absent jobs: a switch with only an incoming job, or an outgoing job unknown here
- refusals before anything moves: the same job twice, a stale epoch
- the duplex link: each direction paced on its own, a shared cap binds both
- an agent restart half-way through a swap: the journal gives every freed chunk back
- one scan of the process table finds each job's processes and their children, as a scan
  per job does
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from rlslice.snapshot_agent import AgentSettings, RunningAgent, start_agent
from rlslice.snapshot_agent.backends import _simfs, _simswap
from rlslice.snapshot_agent.backends._simcopy import Link
from rlslice.v1alpha1 import agent_pb2 as apb
from rlslice.v1alpha1 import agent_pb2_grpc

from .conftest import MiB, eventually, proc_state

PARKED = apb.AGENT_JOB_STATE_PARKED
RUNNING = apb.AGENT_JOB_STATE_RUNNING


def switch(out: list[str], into: str, epoch: int, headroom: int = 0) -> apb.SwitchRequest:
    return apb.SwitchRequest(
        group="g1",
        epoch=epoch,
        outgoing=[apb.SwitchMove(job=j) for j in out],
        incoming=apb.SwitchMove(job=into) if into else None,
        headroom_bytes=headroom,
    )


async def states(stub: Any) -> dict[str, int]:
    status = await stub.Status(apb.AgentStatusRequest())
    return {j.job: j.state for j in status.jobs}


async def used(stub: Any) -> int:
    status = await stub.Status(apb.AgentStatusRequest())
    return sum(d.used_bytes for d in status.devices)


@pytest.fixture
async def full(
    make_settings: Callable[..., AgentSettings],
) -> Any:
    """An agent whose one device holds one 24 MiB job and a bit, copied in 1 MiB chunks."""
    settings = make_settings("n2", sim={"capacity_bytes": 40 * MiB})
    settings = settings.model_copy(update={"backend_options": {"sim": {"chunk_bytes": str(MiB)}}})
    running = await start_agent(settings)
    yield running
    await running.stop(0)


async def two_jobs(agent: RunningAgent, spawn_job: Callable[..., Any], stub: Any) -> Any:
    """job-a running, job-b parked (it ran first)."""
    b = await spawn_job("job-b", "g1", 24 * MiB, "--seed", "2", running=agent)
    await stub.Snapshot(apb.SnapshotRequest(job="job-b", group="g1", epoch=1))
    a = await spawn_job("job-a", "g1", 24 * MiB, "--seed", "1", running=agent)
    return a, b


@pytest.fixture
async def full_stub(full: RunningAgent) -> Any:
    from rlslice.adapters.channel import open_channel

    channel = open_channel(full.address, token=full.token)
    yield agent_pb2_grpc.AgentStub(channel)
    await channel.close(None)


async def test_a_switch_on_a_full_device_admits_incoming_bytes_as_outgoing_bytes_leave(
    full: RunningAgent, full_stub: Any, spawn_job: Callable[..., Any]
) -> None:
    a, b = await two_jobs(full, spawn_job, full_stub)
    assert await used(full_stub) == 24 * MiB  # the two jobs never fit together

    result = await full_stub.Switch(switch(["job-a"], "job-b", 2))

    assert not result.HasField("failure")
    assert result.overlapped  # a restore that waited for the whole snapshot would not be
    (out,) = result.outgoing
    assert (out.job, out.state, out.bytes) == ("job-a", PARKED, 24 * MiB)
    assert (result.incoming.job, result.incoming.state) == ("job-b", RUNNING)
    assert result.incoming.bytes == 24 * MiB
    assert proc_state(a.pid) == "T"
    assert proc_state(b.pid) != "T"
    assert (await b.ask("hash"))["hash"] == b.info["hash"]
    assert await used(full_stub) == 24 * MiB
    assert await states(full_stub) == {"job-a": PARKED, "job-b": RUNNING}

    again = await full_stub.Switch(switch(["job-a"], "job-b", 2))
    assert again.outgoing[0].repeated
    assert again.incoming.repeated

    back = await full_stub.Switch(switch(["job-b"], "job-a", 3))
    assert not back.HasField("failure")
    assert (await a.ask("hash"))["hash"] == a.info["hash"]


async def test_a_failed_restore_half_undoes_both_halves(
    full: RunningAgent, full_stub: Any, spawn_job: Callable[..., Any]
) -> None:
    a, _b = await two_jobs(full, spawn_job, full_stub)
    node_dir = full.settings.sim.root / full.node
    for buffer in _simfs.job_buffers(node_dir, "job-b"):
        buffer.path.unlink()  # the restore half fails: its buffer is gone

    result = await full_stub.Switch(switch(["job-a"], "job-b", 2))

    assert result.failure.job == "job-b"
    assert result.failure.move == "restore"
    assert "gone" in result.failure.reason
    assert result.outgoing[0].state == RUNNING
    assert proc_state(a.pid) != "T"
    assert (await a.ask("hash"))["hash"] == a.info["hash"]
    assert await used(full_stub) == 24 * MiB
    found = await states(full_stub)
    assert found["job-a"] == RUNNING
    assert found["job-b"] == apb.AGENT_JOB_STATE_FAULTED
    assert not (_simfs.parked_dir(node_dir, "job-a")).exists()


async def test_a_failed_snapshot_half_undoes_both_halves(
    make_settings: Callable[..., AgentSettings], spawn_job: Callable[..., Any]
) -> None:
    from rlslice.adapters.channel import open_channel

    settings = make_settings("n2", sim={"capacity_bytes": 40 * MiB})
    # Out at 10 MB/s: 24 MiB take 2.5 s, far past the call's 0.5 s deadline.
    options = {"sim": {"chunk_bytes": str(MiB), "out_gbps": "0.01", "in_gbps": "0"}}
    agent = await start_agent(settings.model_copy(update={"backend_options": options}))
    channel = open_channel(agent.address, token=agent.token)
    stub: Any = agent_pb2_grpc.AgentStub(channel)
    try:
        a, b = await two_jobs(agent, spawn_job, stub)
        # The agent gives up at the call's deadline (less a margin for its answer), or its
        # answer comes too late for the caller: a failure either way.
        call = stub.Switch(switch(["job-a"], "job-b", 2), timeout=0.5)
        outcome = (await asyncio.gather(call, return_exceptions=True))[0]
        if isinstance(outcome, grpc.aio.AioRpcError):
            assert outcome.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        else:
            assert outcome.HasField("failure")

        async def settled() -> bool:
            found = await states(stub)
            return apb.AGENT_JOB_STATE_FAULTED in found.values()

        await eventually(settled, timeout=20)
        found = await states(stub)
        # Whichever half ran out of time first failed, and the other was undone: job-a
        # runs on (FAULTED in snapshot means its state is on the device), job-b stays in
        # host memory (PARKED, or FAULTED in restore).
        assert sorted(found.values()).count(apb.AGENT_JOB_STATE_FAULTED) == 1
        assert found["job-a"] in (RUNNING, apb.AGENT_JOB_STATE_FAULTED)
        assert found["job-b"] in (PARKED, apb.AGENT_JOB_STATE_FAULTED)
        assert proc_state(a.pid) != "T"
        assert (await a.ask("hash"))["hash"] == a.info["hash"]
        assert await used(stub) == 24 * MiB
        # Both copies are whole: the same switch, given time, goes through.
        result = await stub.Switch(switch(["job-a"], "job-b", 5), timeout=60)
        assert not result.HasField("failure")
        assert (await b.ask("hash"))["hash"] == b.info["hash"]
    finally:
        await channel.close(None)
        await agent.stop(0)


async def test_absent_jobs_and_a_switch_with_only_an_incoming_job(
    full: RunningAgent, full_stub: Any, spawn_job: Callable[..., Any]
) -> None:
    _a, b = await two_jobs(full, spawn_job, full_stub)
    await full_stub.Snapshot(apb.SnapshotRequest(job="job-a", group="g1", epoch=2))

    result = await full_stub.Switch(switch(["nobody"], "job-b", 3))

    assert result.outgoing[0].absent
    assert result.incoming.state == RUNNING
    assert not result.overlapped  # nothing was leaving
    assert (await b.ask("hash"))["hash"] == b.info["hash"]


async def test_refusals_change_nothing(
    full: RunningAgent, full_stub: Any, spawn_job: Callable[..., Any]
) -> None:
    a, _b = await two_jobs(full, spawn_job, full_stub)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await full_stub.Switch(switch(["job-a"], "job-a", 2))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await full_stub.Switch(switch(["job-a"], "job-b", 0))  # older than job-b's epoch 1
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert await states(full_stub) == {"job-a": RUNNING, "job-b": PARKED}
    assert proc_state(a.pid) != "T"


def test_the_link_paces_each_direction_on_its_own_and_a_shared_cap_binds_both() -> None:
    duplex = Link(out_gbps=1.0, in_gbps=1.0)
    now = time.perf_counter()
    out = duplex.reserve("out", 10**9)
    into = duplex.reserve("in", 10**9)
    again = duplex.reserve("out", 10**9)
    assert out - now == pytest.approx(1.0, abs=0.05)
    assert into - now == pytest.approx(1.0, abs=0.05)  # the other direction does not queue
    assert again - now == pytest.approx(2.0, abs=0.05)  # the same direction does

    capped = Link(out_gbps=1.0, in_gbps=1.0, shared_gbps=1.0)
    now = time.perf_counter()
    capped.reserve("out", 10**9)
    assert capped.reserve("in", 10**9) - now == pytest.approx(2.0, abs=0.05)


def test_an_interrupted_swap_gets_every_freed_chunk_back_from_the_journal(tmp_path: Path) -> None:
    node_dir = tmp_path / "node"
    _simfs.write_devices(node_dir, [_simfs.SimFsDevice(0, 64 * MiB, "sim0")])
    folder = node_dir / _simfs.JOBS_DIR / "job-a"
    folder.mkdir(parents=True)
    path = folder / "d0-weights.buf"
    content = os.urandom(4 * MiB)
    path.write_bytes(content)
    buffers = _simfs.job_buffers(node_dir, "job-a")

    class Stop(Exception):
        pass

    class Pacer:
        chunk = MiB
        deadline = time.time() + 60
        copied = 0

        def check(self) -> None:
            pass

        def reserve(self, nbytes: int) -> None:
            if self.copied >= 3 * MiB:
                raise Stop  # the agent dies with three chunks out and freed
            self.copied += nbytes

        def wait(self) -> None:
            pass

    import threading

    admission = _simswap.Admission(1, threading.Event())
    with pytest.raises(Stop):
        _simswap.save_freeing(node_dir, "job-a", buffers, Pacer(), admission)
    assert path.stat().st_size == MiB  # three of four chunks left the device
    assert _simswap.interrupted(node_dir, "job-a")

    _simswap.undo_snapshot(node_dir, "job-a", ())

    assert path.read_bytes() == content
    assert not _simfs.parked_dir(node_dir, "job-a").exists()


async def test_the_children_files_find_each_jobs_family_as_a_scan_of_the_whole_table_does(
    agent: RunningAgent, spawn_job: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlslice.snapshot_agent import processes

    a = await spawn_job("job-a", "g1", MiB, "--spawn-child")
    b = await spawn_job("job-b", "g1", MiB)
    entries = agent.engine.table.entries
    groups = [entries["job-a"].processes, entries["job-b"].processes]
    assert processes.HAS_CHILDREN_FILES  # Linux builds it in; CI's kernel does
    found = processes.families(groups)
    assert found == [processes.family(groups[0]), processes.family(groups[1])]
    assert found[0] == tuple(sorted((a.pid, a.info["child"])))
    assert found[1] == (b.pid,)
    monkeypatch.setattr(processes, "HAS_CHILDREN_FILES", False)
    assert processes.families(groups) == found
