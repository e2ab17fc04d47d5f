"""The disk tier below host memory, through a real agent (`sim` backend, real job
processes really frozen, spill files on a real disk folder).

Case matrix:

| case | expected |
|---|---|
| oversubscribed: 4 jobs, the 3 parked ones holding 3x the host budget, round robin, 5 turns each | every turn's bytes identical (sha256 in the job); parked bytes in host memory never above the budget (sampled while the switches run); the disk tier used; tier gauges add up |
| an agent restart with a part on disk | the new agent finds it (tier index) and restores it identical |
| a restart after a spill cut off half-way | the whole host copy wins over its indexed spill file; an unindexed file goes, and so do the files of a job with no parked copy; Status counts disk bytes out of host bytes |
| a torn spill file | the restore fails, FAULTED with a reason naming the file; never wrong bytes |
| a Switch whose incoming job's spill file is torn (halves one after the other) | undone: the outgoing job runs on with its bytes, `failure` names the restore and the file |
| a full spill disk (a tmpfs mounted for the test, root) | the park is refused RESOURCE_EXHAUSTED naming the directory; that job keeps running, the job already parked restores identical |
| a spill disk with room for the part, not its index | refused the same way; the part stays in host memory, its spill file goes |
| a budget without a spill directory | a park over the budget is refused, naming the budget |
| `--host-budget`, `--spill-dir` (and RLSLICE_AGENT_*) | become AgentSettings; none by default |
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from rlslice.adapters.channel import open_channel
from rlslice.snapshot_agent import AgentSettings, RunningAgent, start_agent
from rlslice.snapshot_agent.backends import _simfs
from rlslice.v1alpha1 import agent_pb2 as apb
from rlslice.v1alpha1 import agent_pb2_grpc

from .conftest import MiB

PARKED = apb.AGENT_JOB_STATE_PARKED
RUNNING = apb.AGENT_JOB_STATE_RUNNING
FAULTED = apb.AGENT_JOB_STATE_FAULTED
SIZE = 8 * MiB
JOBS = ["job-a", "job-b", "job-c", "job-d"]
BUDGET = SIZE  # the 3 parked jobs' state is 3x the budget


def host_parked_bytes(node_dir: Path) -> int:
    """Bytes of parked parts in host memory (a fill's temporary file too), read off the sim
    folder, not from the agent."""
    total = 0
    for root, _dirs, files in os.walk(node_dir / _simfs.PARKED_DIR):
        for name in files:
            if not name.endswith((".bin", ".fill")):
                continue  # a manifest or journal: metadata, not parked bytes
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                pass
    return total


class Sampler:
    """The most parked host bytes seen, sampled in a thread while the test runs."""

    def __init__(self, node_dir: Path) -> None:
        self.node_dir, self.peak = node_dir, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, host_parked_bytes(self.node_dir))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


async def open_stub(agent: RunningAgent) -> Any:
    channel = open_channel(agent.address, token=agent.token)
    return channel, agent_pb2_grpc.AgentStub(channel)


async def job_states(stub: Any) -> dict[str, Any]:
    status = await stub.Status(apb.AgentStatusRequest())
    return {j.job: j for j in status.jobs}


@pytest.fixture
def tiered(make_settings: Callable[..., AgentSettings], tmp_path: Path) -> AgentSettings:
    return make_settings(
        "n3",
        host_budget_bytes=BUDGET,
        spill_dir=tmp_path / "spill",
        sim={"capacity_bytes": 64 * MiB},
    )


async def test_four_jobs_over_three_times_the_budget_take_turns_with_identical_bytes(
    tiered: AgentSettings, spawn_job: Callable[..., Any], tmp_path: Path
) -> None:
    agent = await start_agent(tiered)
    channel, stub = await open_stub(agent)
    node_dir = tiered.sim.root / tiered.node
    try:
        jobs = {}
        for seed, name in enumerate(JOBS):
            jobs[name] = await spawn_job(name, "g1", SIZE, "--seed", str(seed), running=agent)
        hashes = {name: job.info["hash"] for name, job in jobs.items()}
        epoch = 1
        with Sampler(node_dir) as sampler:
            for name in JOBS[1:]:  # job-a holds; the others park, spilling as they must
                await stub.Snapshot(apb.SnapshotRequest(job=name, group="g1", epoch=epoch))
                epoch += 1
            holder = "job-a"
            for turn in range(5 * len(JOBS)):
                incoming = JOBS[(turn + 1) % len(JOBS)]
                request = apb.SwitchRequest(
                    group="g1",
                    epoch=epoch,
                    outgoing=[apb.SwitchMove(job=holder)],
                    incoming=apb.SwitchMove(job=incoming),
                )
                epoch += 1
                result = await stub.Switch(request, timeout=60)
                assert not result.HasField("failure"), result.failure.reason
                assert result.incoming.state == RUNNING
                assert (await jobs[incoming].ask("hash"))["hash"] == hashes[incoming]
                holder = incoming
        assert sampler.peak <= BUDGET, (sampler.peak, BUDGET)
        states = await job_states(stub)
        assert [states[j].state for j in JOBS] == [RUNNING, PARKED, PARKED, PARKED]
        metrics = agent.metrics.registry
        await agent.engine.refresh_metrics()
        dram = metrics.get_sample_value("rlslice_agent_tier_bytes", {"tier": "dram"})
        disk = metrics.get_sample_value("rlslice_agent_tier_bytes", {"tier": "disk"})
        assert dram is not None
        assert disk is not None
        assert dram <= BUDGET
        assert dram + disk == 3 * SIZE
        assert disk >= 3 * SIZE - BUDGET
        spilled = metrics.get_sample_value(
            "rlslice_agent_tier_moved_bytes_total", {"direction": "spill"}
        )
        assert spilled is not None
        assert spilled >= 5 * SIZE
        filled = metrics.get_sample_value("rlslice_agent_fill_seconds_count")
        assert filled is not None
        assert filled >= 5
    finally:
        await channel.close(None)
        await agent.stop(0)


async def park_three(
    stub: Any, spawn_job: Callable[..., Any], agent: RunningAgent
) -> dict[str, Any]:
    """job-b, job-c, job-d parked (job-b, the oldest, on disk); job-a runs."""
    jobs = {}
    for seed, name in enumerate(JOBS):
        jobs[name] = await spawn_job(name, "g1", SIZE, "--seed", str(seed), running=agent)
    for epoch, name in enumerate(JOBS[1:], start=1):
        await stub.Snapshot(apb.SnapshotRequest(job=name, group="g1", epoch=epoch))
    return jobs


def spill_files(settings: AgentSettings, job: str) -> list[Path]:
    assert settings.spill_dir is not None
    return sorted((settings.spill_dir / settings.node / job).glob("*.bin"))


async def test_spilled_bytes_survive_an_agent_restart(
    tiered: AgentSettings, spawn_job: Callable[..., Any]
) -> None:
    agent = await start_agent(tiered)
    channel, stub = await open_stub(agent)
    try:
        jobs = await park_three(stub, spawn_job, agent)
        assert spill_files(tiered, "job-b")
    finally:
        await channel.close(None)
        await agent.stop(0)
    again = await start_agent(tiered)
    channel, stub = await open_stub(again)
    try:
        assert again.engine.tiering.spilled("job-b")
        await stub.Restore(apb.RestoreRequest(job="job-b", group="g1", epoch=10))
        assert (await jobs["job-b"].ask("hash"))["hash"] == jobs["job-b"].info["hash"]
        assert spill_files(tiered, "job-b") == []
    finally:
        await channel.close(None)
        await again.stop(0)


async def test_a_restart_settles_a_spill_cut_off_half_way(
    tiered: AgentSettings, spawn_job: Callable[..., Any]
) -> None:
    agent = await start_agent(tiered)
    channel, stub = await open_stub(agent)
    try:
        jobs = await park_three(stub, spawn_job, agent)
    finally:
        await channel.close(None)
        await agent.stop(0)
    # As if the agent stopped after job-b's spill was indexed but before its host copy went,
    # and while a spill of job-c's next part had written a file it never indexed.
    (spilled,) = spill_files(tiered, "job-b")
    park = _simfs.parked_dir(tiered.sim.root / tiered.node, "job-b")
    shutil.copyfile(spilled, park / spilled.name)
    assert tiered.spill_dir is not None
    stray = tiered.spill_dir / tiered.node / "job-c" / "cut-off.bin"
    stray.write_bytes(b"half a part")
    gone = tiered.spill_dir / tiered.node / "job-gone"  # released while this agent was down
    shutil.copytree(spilled.parent, gone)
    again = await start_agent(tiered)
    channel, stub = await open_stub(again)
    try:
        assert not again.engine.tiering.spilled("job-b")  # the whole host copy wins
        assert spill_files(tiered, "job-b") == []
        assert not stray.exists()
        assert not gone.exists()  # no parked copy: its spill files go
        assert again.engine.tiering.spilled("job-c")
        status = await job_states(stub)
        assert status["job-c"].host_bytes == 0  # on disk, not in host memory
        assert status["job-d"].host_bytes == SIZE
        for epoch, name in ((10, "job-b"), (11, "job-c")):
            await stub.Restore(apb.RestoreRequest(job=name, group="g1", epoch=epoch))
            assert (await jobs[name].ask("hash"))["hash"] == jobs[name].info["hash"]
    finally:
        await channel.close(None)
        await again.stop(0)


async def test_a_torn_spill_file_faults_the_restore_naming_the_file(
    tiered: AgentSettings, spawn_job: Callable[..., Any]
) -> None:
    agent = await start_agent(tiered)
    channel, stub = await open_stub(agent)
    try:
        await park_three(stub, spawn_job, agent)
        (torn,) = spill_files(tiered, "job-b")
        os.truncate(torn, SIZE // 2)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Restore(apb.RestoreRequest(job="job-b", group="g1", epoch=10))
        assert f"spill file {torn} is torn" in (caught.value.details() or "")
        state = (await job_states(stub))["job-b"]
        assert state.state == FAULTED
        assert str(torn) in state.reason
    finally:
        await channel.close(None)
        await agent.stop(0)


async def test_a_switch_to_a_job_with_a_torn_spill_file_is_undone(
    tiered: AgentSettings, spawn_job: Callable[..., Any]
) -> None:
    agent = await start_agent(tiered)
    channel, stub = await open_stub(agent)
    try:
        jobs = await park_three(stub, spawn_job, agent)
        (torn,) = spill_files(tiered, "job-b")
        os.truncate(torn, SIZE - 1)
        request = apb.SwitchRequest(
            group="g1",
            epoch=10,
            outgoing=[apb.SwitchMove(job="job-a")],
            incoming=apb.SwitchMove(job="job-b"),
        )
        result = await stub.Switch(request, timeout=60)
        assert result.failure.job == "job-b"
        assert result.failure.move == "restore"
        assert f"spill file {torn} is torn" in result.failure.reason
        states = await job_states(stub)
        assert states["job-a"].state == RUNNING  # parked, spilled, filled and put back
        assert (await jobs["job-a"].ask("hash"))["hash"] == jobs["job-a"].info["hash"]
        assert states["job-b"].state == FAULTED
    finally:
        await channel.close(None)
        await agent.stop(0)


@pytest.fixture
def small_spill_fs(tmp_path: Path) -> Iterator[Path]:
    """A 10 MiB tmpfs mounted as the spill directory (root only; failed under CI)."""
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("the full-disk test needs root to mount a tmpfs")
        pytest.skip("needs root to mount a tmpfs")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=10m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


async def test_a_full_spill_disk_refuses_the_park_and_loses_nothing(
    make_settings: Callable[..., AgentSettings], small_spill_fs: Path, spawn_job: Callable[..., Any]
) -> None:
    settings = make_settings("n3", host_budget_bytes=BUDGET, spill_dir=small_spill_fs)
    agent = await start_agent(settings)
    channel, stub = await open_stub(agent)
    try:
        jobs = {}
        for seed, name in enumerate(JOBS):
            jobs[name] = await spawn_job(name, "g1", SIZE, "--seed", str(seed), running=agent)
        await stub.Snapshot(apb.SnapshotRequest(job="job-b", group="g1", epoch=1))
        await stub.Snapshot(apb.SnapshotRequest(job="job-c", group="g1", epoch=2))  # b spills
        assert spill_files(settings, "job-b")
        with pytest.raises(grpc.aio.AioRpcError) as caught:  # c cannot spill: 10 MiB disk
            await stub.Snapshot(apb.SnapshotRequest(job="job-d", group="g1", epoch=3))
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"spill directory {small_spill_fs / 'n3' / 'job-c'} is full" in (
            caught.value.details() or ""
        )
        states = await job_states(stub)
        assert states["job-d"].state == RUNNING
        assert (await jobs["job-d"].ask("hash"))["hash"] == jobs["job-d"].info["hash"]
        assert spill_files(settings, "job-c") == []
        for epoch, name in ((4, "job-c"), (5, "job-b")):  # from host memory, then disk
            await stub.Restore(apb.RestoreRequest(job=name, group="g1", epoch=epoch))
            assert (await jobs[name].ask("hash"))["hash"] == jobs[name].info["hash"]
    finally:
        await channel.close(None)
        await agent.stop(0)


@pytest.fixture
def exact_spill_fs(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of exactly one part (8 MiB): the part's file fits, its index does not."""
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("the full-disk test needs root to mount a tmpfs")
        pytest.skip("needs root to mount a tmpfs")
    mount = tmp_path / "exact"
    mount.mkdir()
    size = f"size={SIZE // 1024}k"
    subprocess.run(["mount", "-t", "tmpfs", "-o", size, "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


async def test_a_disk_full_for_the_index_keeps_the_part_in_host_memory(
    make_settings: Callable[..., AgentSettings], exact_spill_fs: Path, spawn_job: Callable[..., Any]
) -> None:
    settings = make_settings("n3", host_budget_bytes=BUDGET, spill_dir=exact_spill_fs)
    agent = await start_agent(settings)
    channel, stub = await open_stub(agent)
    try:
        jobs = {}
        for seed, name in enumerate(JOBS[:3]):
            jobs[name] = await spawn_job(name, "g1", SIZE, "--seed", str(seed), running=agent)
        await stub.Snapshot(apb.SnapshotRequest(job="job-b", group="g1", epoch=1))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Snapshot(apb.SnapshotRequest(job="job-c", group="g1", epoch=2))
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        index = exact_spill_fs / "n3" / "job-b" / "index.json"
        assert f"spill directory {index.parent} is full" in (caught.value.details() or "")
        assert not agent.engine.tiering.spilled("job-b")
        assert spill_files(settings, "job-b") == []
        await stub.Restore(apb.RestoreRequest(job="job-b", group="g1", epoch=3))
        assert (await jobs["job-b"].ask("hash"))["hash"] == jobs["job-b"].info["hash"]
        assert (await job_states(stub))["job-c"].state == RUNNING
    finally:
        await channel.close(None)
        await agent.stop(0)


async def test_a_budget_without_a_spill_directory_refuses_the_park(
    make_settings: Callable[..., AgentSettings], spawn_job: Callable[..., Any]
) -> None:
    settings = make_settings("n3", host_budget_bytes=BUDGET)
    agent = await start_agent(settings)
    channel, stub = await open_stub(agent)
    try:
        for seed, name in enumerate(JOBS[:3]):
            await spawn_job(name, "g1", SIZE, "--seed", str(seed), running=agent)
        await stub.Snapshot(apb.SnapshotRequest(job="job-a", group="g1", epoch=1))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Snapshot(apb.SnapshotRequest(job="job-b", group="g1", epoch=2))
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "no spill directory is set" in (caught.value.details() or "")
        assert (await job_states(stub))["job-b"].state == RUNNING
    finally:
        await channel.close(None)
        await agent.stop(0)


def test_the_disk_tier_flags_and_variables_become_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from rlslice.apps import agent as command

    parser = argparse.ArgumentParser()
    command.configure(parser)
    plain = command.settings_from(parser.parse_args(["--state-dir", str(tmp_path)]))
    assert plain.host_budget_bytes is None
    assert plain.spill_dir is None
    monkeypatch.setenv("RLSLICE_AGENT_SPILL_DIR", str(tmp_path / "nvme"))
    parser = argparse.ArgumentParser()  # variables are read as the flags are declared
    command.configure(parser)
    args = parser.parse_args(["--host-budget", "64GiB", "--state-dir", str(tmp_path)])
    settings = command.settings_from(args)
    assert settings.host_budget_bytes == 64 << 30
    assert settings.spill_dir == tmp_path / "nvme"
