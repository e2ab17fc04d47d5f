"""The agent as a service: restarts, authentication, exposure, metrics, the scheduler link.

Case matrix:
- restart: a parked job is re-read as parked and restores to the same bytes
- crash mid-snapshot (the agent process SIGKILLed): the restarted agent re-reads the job as
  running, resumes its stopped processes, and its bytes are intact
- tokens: Agent methods without / with a wrong / with the agent token; health needs none
- exposure: a non-loopback address without token or TLS is refused at start
- metrics: histograms, moved bytes, jobs by state, device and host gauges; served over HTTP
- the scheduler link: registers at start, and again after the scheduler restarts
- Probe lists the installed backends with a reason for each unusable one
"""

from __future__ import annotations

import asyncio
import signal
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlslice._errors import InvalidArgumentError
from rlslice.adapters.auth import local_agent_token
from rlslice.adapters.channel import open_channel
from rlslice.snapshot_agent import AgentSettings, RunningAgent, start_agent
from rlslice.v1alpha1 import agent_pb2 as apb
from rlslice.v1alpha1 import agent_pb2_grpc

from .conftest import MiB, eventually, proc_state


async def _job(stub: Any, job: str) -> apb.AgentJob | None:
    status = await stub.Status(apb.AgentStatusRequest())
    return next((j for j in status.jobs if j.job == job), None)


async def test_a_restarted_agent_re_reads_a_parked_job_and_restores_it(
    make_settings: Callable[..., AgentSettings], spawn_job: Callable[..., Any]
) -> None:
    settings = make_settings("n2")
    first = await start_agent(settings)
    job = await spawn_job("job-a", "g1", 8 * MiB, running=first)
    channel = open_channel(first.address, token=first.token)
    await agent_pb2_grpc.AgentStub(channel).Snapshot(
        apb.SnapshotRequest(job="job-a", group="g1", epoch=4)
    )
    await channel.close(None)
    await first.stop(0)
    assert proc_state(job.pid) == "T"

    second = await start_agent(settings)
    channel = open_channel(second.address, token=second.token)
    try:
        stub = agent_pb2_grpc.AgentStub(channel)
        entry = await _job(stub, "job-a")
        assert entry is not None
        assert entry.state == apb.AGENT_JOB_STATE_PARKED
        assert (entry.epoch, entry.host_bytes, list(entry.pids)) == (4, 8 * MiB, [job.pid])
        repeat = await stub.Snapshot(apb.SnapshotRequest(job="job-a", group="g1", epoch=4))
        assert repeat.repeated
        await stub.Restore(apb.RestoreRequest(job="job-a", group="g1", epoch=5))
        assert (await job.ask("hash"))["hash"] == job.info["hash"]
    finally:
        await channel.close(None)
        await second.stop(0)


async def test_an_agent_killed_mid_snapshot_leaves_the_job_running_after_its_restart(
    make_settings: Callable[..., AgentSettings], spawn_job: Callable[..., Any], short_dir: Path
) -> None:
    settings = make_settings("n2", sim={"rate_gbps": 0.02})  # 32 MiB take 1.7 s
    args = [
        sys.executable, "-m", "rlslice.apps", "agent", "--node", "n2",
        "--address", "127.0.0.1:0", "--socket", str(settings.socket_path),
        "--state-dir", str(settings.state_dir), "--sim-root", str(settings.sim.root),
        "--sim-capacity", "64MiB", "--sim-rate-gbps", "0.02", "--host-reserve", "0",
    ]  # fmt: skip

    async def launch() -> tuple[asyncio.subprocess.Process, str]:
        process = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.PIPE)
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        return process, line.split(" serving on ")[1].split(",")[0]

    process, address = await launch()
    running = RunningAgentStandIn(settings)
    job = await spawn_job("job-a", "g1", 32 * MiB, running=running)
    channel = open_channel(address, token=local_agent_token())
    try:
        stub = agent_pb2_grpc.AgentStub(channel)
        call = asyncio.ensure_future(
            stub.Snapshot(apb.SnapshotRequest(job="job-a", group="g1", epoch=1))
        )
        await eventually(lambda: proc_state(job.pid) == "T")
        await asyncio.sleep(0.2)  # well into the copy
        process.send_signal(signal.SIGKILL)
        await process.wait()
        with pytest.raises(grpc.aio.AioRpcError):
            await call
        assert proc_state(job.pid) == "T"  # frozen, with nobody left to thaw it
    finally:
        await channel.close(None)

    process, address = await launch()
    channel = open_channel(address, token=local_agent_token())
    try:
        stub = agent_pb2_grpc.AgentStub(channel)
        entry = await _job(stub, "job-a")
        assert entry is not None
        assert entry.state == apb.AGENT_JOB_STATE_RUNNING
        assert entry.device_bytes == 32 * MiB
        assert proc_state(job.pid) in ("S", "R")
        assert (await job.ask("hash"))["hash"] == job.info["hash"]
    finally:
        await channel.close(None)
        process.terminate()
        await asyncio.wait_for(process.wait(), 20)


class RunningAgentStandIn:
    """What `spawn_job` needs to reach an agent that runs in another process."""

    def __init__(self, settings: AgentSettings) -> None:
        self.settings = settings
        self.socket_path = settings.socket_path
        self.node = settings.node


async def test_agent_methods_need_the_agent_token_and_health_needs_none(
    make_settings: Callable[..., AgentSettings],
) -> None:
    guarded = await start_agent(make_settings("n2", token="s3cret"))
    try:
        for token, code in [
            (None, grpc.StatusCode.UNAUTHENTICATED),
            ("wrong", grpc.StatusCode.UNAUTHENTICATED),
        ]:
            channel = open_channel(guarded.address, token=token)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await agent_pb2_grpc.AgentStub(channel).Status(apb.AgentStatusRequest())
            assert caught.value.code() == code
            health = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="rlslice.v1alpha1.Agent")
            )
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            await channel.close(None)
        channel = open_channel(guarded.address, token="s3cret")
        status = await agent_pb2_grpc.AgentStub(channel).Status(apb.AgentStatusRequest())
        assert status.node == "n2"
        await channel.close(None)
    finally:
        await guarded.stop(0)


@pytest.mark.parametrize("address", ["0.0.0.0:0", "[::]:0", "192.0.2.1:0", "example-host:0"])
async def test_an_address_beyond_loopback_without_token_or_tls_is_refused(
    make_settings: Callable[..., AgentSettings], address: str
) -> None:
    with pytest.raises(InvalidArgumentError, match="token"):
        await start_agent(make_settings("n2", address=address))


async def test_metrics_count_moves_and_report_memory(
    make_settings: Callable[..., AgentSettings], spawn_job: Callable[..., Any]
) -> None:
    measured = await start_agent(make_settings("n2", metrics_port=0))
    channel = open_channel(measured.address, token=measured.token)
    try:
        stub = agent_pb2_grpc.AgentStub(channel)
        await spawn_job("job-a", "g1", 4 * MiB, running=measured)
        await stub.Snapshot(apb.SnapshotRequest(job="job-a", group="g1", epoch=1))
        registry = measured.metrics.registry
        value = registry.get_sample_value
        assert value("rlslice_agent_snapshot_seconds_count", {"backend": "sim"}) == 1
        assert value("rlslice_agent_moved_bytes_total", {"direction": "out"}) == 4 * MiB
        assert value("rlslice_agent_jobs", {"state": "parked"}) == 1
        assert value("rlslice_agent_parked_bytes") == 4 * MiB
        assert value("rlslice_agent_device_used_bytes", {"device": "0"}) == 0
        await stub.Restore(apb.RestoreRequest(job="job-a", group="g1", epoch=2))
        assert value("rlslice_agent_restore_seconds_count", {"backend": "sim"}) == 1
        assert value("rlslice_agent_moved_bytes_total", {"direction": "in"}) == 4 * MiB
        assert value("rlslice_agent_jobs", {"state": "running"}) == 1
        assert value("rlslice_agent_device_used_bytes", {"device": "0"}) == 4 * MiB
        assert value("rlslice_agent_device_total_bytes", {"device": "0"}) == 64 * MiB
        assert (value("rlslice_agent_host_available_bytes") or 0) > 0
        url = f"http://127.0.0.1:{measured.metrics_port}/metrics"
        text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())
        assert b'rlslice_agent_moved_bytes_total{direction="in"}' in text
    finally:
        await channel.close(None)
        await measured.stop(0)


async def test_the_agent_registers_with_its_scheduler_and_again_after_a_restart(
    make_settings: Callable[..., AgentSettings],
) -> None:
    server = pytest.importorskip("rlslice.scheduler.server")
    from rlslice.scheduler.settings import SchedulerSettings

    scheduler = await server.start_scheduler(SchedulerSettings(address="127.0.0.1:0"))
    address = scheduler.address
    linked = await start_agent(make_settings("n2", scheduler=address))
    try:
        link = linked.scheduler_link
        assert link is not None
        assert await link.wait_registered(10)
        record = scheduler.coordinator.agents["n2"]
        assert record.address == linked.address
        assert record.backends
        assert "sim" in record.backends
        assert tuple(record.device_total_bytes) == (64 * MiB,)
        await scheduler.stop(0)

        scheduler = await server.start_scheduler(SchedulerSettings(address=address))
        # The agent counts a registration once the scheduler's answer is back, a moment
        # after the scheduler added it: wait for the agent's side.
        await eventually(lambda: link.registrations >= 2, timeout=15)
        assert "n2" in scheduler.coordinator.agents
    finally:
        await linked.stop(0)
        await scheduler.stop(0)


async def test_probe_lists_every_backend_with_a_reason_for_the_unusable(stub: Any) -> None:
    response = await stub.Probe(apb.ProbeRequest())
    found = {b.name: b for b in response.backends}
    assert found["sim"].usable
    assert "emulated" in found["sim"].detail
    for probe in found.values():
        assert probe.detail


async def test_an_address_already_taken_is_refused_naming_the_field(
    agent: RunningAgent, make_settings: Callable[..., AgentSettings]
) -> None:
    with pytest.raises(InvalidArgumentError, match=r"^address: cannot bind"):
        await start_agent(make_settings("n2", address=agent.address))
