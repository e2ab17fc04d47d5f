"""The tracing hooks wired into the components, end to end with the OpenTelemetry SDK's
in-memory exporter: a real scheduler and agent on loopback, two real job processes, two
clients. Job a acquires, job b waits, a yields: the switch parks a.

Expected spans: `rlslice.acquire` for each client (group, job, phase; epoch and
waited_seconds at the end), an `rlslice.switch` to b (group, incoming, nodes; outcome
done, outgoing a), one `rlslice.snapshot` of a on the node (backend, epoch, bytes,
seconds), and no restore (b never left the device).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rlslice.adapters import tracing as _tracing
from rlslice.client import AsyncClient
from rlslice.config import GroupSpec
from rlslice.scheduler import SchedulerSettings, start_scheduler
from rlslice.snapshot_agent import AgentSettings, SimSettings, start_agent
from rlslice.snapshot_agent.processes import identify

from .conftest import eventually


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    _tracing.use(provider)
    yield memory
    _tracing.reset()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
async def jobs() -> AsyncIterator[list[int]]:
    processes = [
        await asyncio.create_subprocess_exec("sleep", "120", stdin=asyncio.subprocess.DEVNULL)
        for _ in range(2)
    ]
    yield [p.pid for p in processes]
    for process in processes:
        process.kill()
        await process.wait()


async def test_acquire_switch_and_snapshot_are_traced(
    exporter: InMemorySpanExporter,
    short_dir: Path,
    tmp_path: Path,
    jobs: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("RLSLICE_AGENT_SOCKET", "RLSLICE_TOKEN", "RLSLICE_JOB", "RLSLICE_GROUP"):
        monkeypatch.delenv(name, raising=False)
    scheduler = await start_scheduler(
        SchedulerSettings(
            address="127.0.0.1:0",
            # A headroom larger than the device: b never fits beside a, so a is parked.
            groups=(GroupSpec(name="g", backend="sim", headroom_bytes=128 << 20),),
        )
    )
    agent = await start_agent(
        AgentSettings(
            node="n1",
            socket_path=short_dir / "agent.sock",
            state_dir=tmp_path / "state",
            host_reserve_bytes=0,
            sim=SimSettings(root=short_dir / "sim", capacity_bytes=64 << 20, rate_gbps=0.0),
            scheduler=scheduler.address,
        )
    )
    clients = [AsyncClient(job=job, group="g", scheduler=scheduler.address) for job in "ab"]
    try:
        await eventually(lambda: "n1" in scheduler.coordinator.agents, what="the agent")
        for job, pid in zip("ab", jobs, strict=True):
            ref = identify(pid)
            assert ref is not None
            agent.engine.register(ref, job, "g")
        first = await clients[0].acquire(phase="rollout")
        waiting = asyncio.ensure_future(clients[1].acquire(phase="train"))
        await eventually(
            lambda: [w.job for w in scheduler.engine.groups["g"].state.queue] == ["b"],
            what="b waiting",
        )
        await clients[0].yield_()
        second = await waiting
    finally:
        for client in clients:
            await client.close()
        await agent.stop(0)
        await scheduler.stop(0)

    spans = exporter.get_finished_spans()
    by_name: dict[str, list[dict[str, object]]] = {}
    for finished in spans:
        by_name.setdefault(finished.name, []).append(dict(finished.attributes or {}))

    acquires = {a["rlslice.job"]: a for a in by_name["rlslice.acquire"]}
    assert acquires["a"]["rlslice.phase"] == "rollout"
    assert acquires["a"]["rlslice.epoch"] == first.epoch
    assert acquires["b"]["rlslice.epoch"] == second.epoch
    assert acquires["b"]["rlslice.group"] == "g"
    assert float(acquires["b"]["rlslice.waited_seconds"]) > 0  # type: ignore[arg-type]

    (switch,) = [s for s in by_name["rlslice.switch"] if s["rlslice.incoming"] == "b"]
    assert switch["rlslice.group"] == "g"
    assert switch["rlslice.incoming"] == "b"
    assert switch["rlslice.outcome"] == "done"
    assert tuple(switch["rlslice.outgoing"]) == ("a",)  # type: ignore[arg-type]
    assert tuple(switch["rlslice.nodes"]) == ("n1",)  # type: ignore[arg-type]

    (snapshot,) = by_name["rlslice.snapshot"]
    assert snapshot["rlslice.job"] == "a"
    assert snapshot["rlslice.node"] == "n1"
    assert snapshot["rlslice.backend"] == "sim"
    assert snapshot["rlslice.epoch"] == switch["rlslice.epoch"]
    assert "rlslice.seconds" in snapshot
    assert "rlslice.restore" not in by_name  # b never left the device
