"""`top`, `timeline` and the metric catalogue against a real scheduler on loopback.

Two jobs drive the scheduler through raw stubs (Register, Acquire, Yield); nothing of ours
is faked.

Case matrix:

| tool | checked |
|---|---|
| `top`'s stream fold (`follow`) | starts from the SNAPSHOT (holder a), sees b queue, then the holder change to b |
| `rlslice top --once` | prints the group with its holder and queue |
| `rlslice top --iterations N` | exits after N stream messages |
| `rlslice top` with no scheduler | exit 1, one line naming the address |
| `fetch_events` + `build_timeline` | a's hold, b's wait, b's hold, in order, from the real event ring |
| `rlslice timeline --scheduler` | trace, PNG and saved log written; the saved log rebuilds the same trace |
| `/metrics` of the scheduler, the agent's registry | exactly the catalogued names (no drift either way) |
"""

from __future__ import annotations

import asyncio
import io
import json
import socket
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import ModuleType
from typing import cast
from urllib.request import urlopen

import pytest
from rich.console import Console

from rlslice.adapters.channel import open_channel
from rlslice.apps.cli import main
from rlslice.apps.timeline.command import fetch_events
from rlslice.apps.timeline.trace_export import build_timeline, chrome_trace, events_from_json
from rlslice.apps.top import TopState, follow, render
from rlslice.scheduler import RunningScheduler, SchedulerSettings, start_scheduler
from rlslice.v1alpha1 import scheduler_pb2 as pb
from rlslice.v1alpha1 import scheduler_pb2_grpc

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def scheduler() -> AsyncIterator[RunningScheduler]:
    running = await start_scheduler(
        SchedulerSettings(
            address="127.0.0.1:0", store="memory", auto_create_groups=True, metrics_port=0
        )
    )
    yield running
    await running.stop(0.1)


class Jobs:
    """Two registered jobs, a and b, in group g1, driven through a raw stub."""

    def __init__(self, stub: scheduler_pb2_grpc.SchedulerAsyncStub) -> None:
        self.stub = stub
        self.leases: dict[str, pb.RegisterResponse] = {}

    async def register(self, *jobs: str) -> None:
        for job in jobs:
            self.leases[job] = await self.stub.Register(
                pb.RegisterRequest(job=job, group="g1", lease_seconds=60)
            )

    async def acquire(self, job: str, phase: str) -> pb.Grant:
        lease = self.leases[job]
        return await self.stub.Acquire(
            pb.AcquireRequest(
                job=job, group="g1", lease_id=lease.lease_id, secret=lease.secret, phase=phase
            ),
            timeout=20,
        )

    async def yield_(self, job: str) -> None:
        lease = self.leases[job]
        await self.stub.Yield(
            pb.YieldRequest(job=job, group="g1", lease_id=lease.lease_id, secret=lease.secret)
        )


class Seen:
    """The states `follow` reports, and a way to wait for one (no polling)."""

    def __init__(self) -> None:
        self.states: list[TopState] = []
        self._changed = asyncio.Condition()

    def __call__(self, state: TopState) -> None:
        self.states.append(state)
        asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def until(self, condition: Callable[[TopState], bool], timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: any(condition(s) for s in self.states[-1:]))


async def hand_over(jobs: Jobs) -> None:
    """a holds for "rollout", b queues for "train", a yields, b holds."""
    await jobs.register("a", "b")
    await jobs.acquire("a", "rollout")
    second = asyncio.create_task(jobs.acquire("b", "train"))
    await asyncio.sleep(0.2)
    await jobs.yield_("a")
    await second


def stub_of(channel: object) -> scheduler_pb2_grpc.SchedulerAsyncStub:
    return cast(
        "scheduler_pb2_grpc.SchedulerAsyncStub",
        scheduler_pb2_grpc.SchedulerStub(channel),  # type: ignore[arg-type]
    )


async def test_tops_fold_sees_the_holder_change_through_watch(
    scheduler: RunningScheduler,
) -> None:
    async with open_channel(scheduler.address) as channel:
        jobs = Jobs(stub_of(channel))
        await jobs.register("a", "b")
        await jobs.acquire("a", "rollout")
        seen = Seen()

        def b_holds(state: TopState) -> bool:
            return "g1" in state.groups and state.groups["g1"].holder == "b"

        follower = asyncio.create_task(follow(channel, "", on_state=seen, stop=b_holds))
        await seen.until(lambda state: "g1" in state.groups)
        assert seen.states[0].groups["g1"].holder == "a"  # the SNAPSHOT comes first
        second = asyncio.create_task(jobs.acquire("b", "train"))
        await seen.until(lambda state: state.groups["g1"].queue == ("b",))
        await jobs.yield_("a")
        final = await asyncio.wait_for(follower, 10)
        await second
    group = final.groups["g1"]
    assert group.holder == "b"
    assert group.queue == ()
    assert group.epoch >= 2
    assert "b" in group.resident
    console = Console(record=True, width=160, file=io.StringIO())
    console.print(render(final, time.time()))
    row = next(line for line in console.export_text().splitlines() if "g1" in line)
    assert "b (" in row
    holders = [s.groups["g1"].holder for s in seen.states]
    assert holders[0] == "a"
    assert holders[-1] == "b"


async def test_top_once_prints_the_group_with_holder_and_queue(
    scheduler: RunningScheduler, capsys: pytest.CaptureFixture[str]
) -> None:
    async with open_channel(scheduler.address) as channel:
        jobs = Jobs(stub_of(channel))
        await jobs.register("a", "b")
        await jobs.acquire("a", "rollout")
        waiting = asyncio.create_task(jobs.acquire("b", "train"))
        await asyncio.sleep(0.2)
        code = await asyncio.to_thread(main, ["top", "--scheduler", scheduler.address, "--once"])
        out = capsys.readouterr().out
        await jobs.yield_("a")
        await waiting
    assert code == 0
    row = next(line for line in out.splitlines() if "g1" in line)
    assert "a (" in row  # holder, with how long it has held
    assert " b " in row  # the queue
    assert "1 groups, 1 held, 1 waiting" in out


async def test_top_iterations_stops_after_that_many_messages(
    scheduler: RunningScheduler, capsys: pytest.CaptureFixture[str]
) -> None:
    async with open_channel(scheduler.address) as channel:
        jobs = Jobs(stub_of(channel))
        await jobs.register("a")
        code = await asyncio.to_thread(
            main, ["top", "--scheduler", scheduler.address, "--iterations", "1"]
        )
    assert code == 0
    assert "1 events" in capsys.readouterr().out


def test_top_without_a_scheduler_exits_1_naming_the_address(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    assert main(["top", "--scheduler", address, "--once", "--timeout", "5"]) == 1
    err = capsys.readouterr().err
    assert address in err
    assert len(err.strip().splitlines()) == 1


async def test_the_real_event_ring_becomes_a_timeline_of_the_hand_over(
    scheduler: RunningScheduler,
) -> None:
    async with open_channel(scheduler.address) as channel:
        await hand_over(Jobs(stub_of(channel)))
    events = await fetch_events(scheduler.address, "g1")
    kinds = [e.kind for e in events]
    assert kinds.index("GRANTED") < kinds.index("YIELDED")
    timeline = build_timeline(events, "g1")
    spans = [(i.lane, i.category, i.name) for i in timeline.intervals if i.lane in ("a", "b")]
    assert ("a", "held", "rollout") in spans
    assert ("b", "waiting", "waiting") in spans
    assert ("b", "held", "train") in spans
    held = {i.lane: i for i in timeline.intervals if i.category == "held"}
    waited = next(i for i in timeline.intervals if i.lane == "b" and i.category == "waiting")
    assert held["a"].end <= held["b"].start
    assert waited.seconds >= 0.15  # b queued while a held for 0.2 s
    assert held["b"].args["ended_by"] == "open"


async def test_timeline_command_writes_trace_png_and_a_log_that_rebuilds_it(
    scheduler: RunningScheduler, tmp_path: Path
) -> None:
    async with open_channel(scheduler.address) as channel:
        await hand_over(Jobs(stub_of(channel)))
    trace, png, log = tmp_path / "g1.json", tmp_path / "g1.png", tmp_path / "events.json"
    arguments = ["timeline", "g1", "--scheduler", scheduler.address, "--save-log", str(log)]
    code = await asyncio.to_thread(main, [*arguments, "--out", str(trace), "--out", str(png)])
    assert code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rebuilt = chrome_trace(build_timeline(events_from_json(json.loads(log.read_text())), "g1"))
    assert json.loads(trace.read_text()) == rebuilt
    lanes = {e["args"]["name"] for e in rebuilt["traceEvents"] if e["name"] == "thread_name"}
    assert {"a", "b"} <= lanes


def exported_names(text: str) -> set[str]:
    from prometheus_client.parser import text_string_to_metric_families

    names = set()
    for family in text_string_to_metric_families(text):
        if family.name.endswith("_created"):  # prometheus_client's creation timestamps
            continue
        names.add(f"{family.name}_total" if family.type == "counter" else family.name)
    return names


async def test_the_scheduler_exports_exactly_the_catalogued_metrics(
    scheduler: RunningScheduler, catalogue: ModuleType
) -> None:
    async with open_channel(scheduler.address) as channel:
        await hand_over(Jobs(stub_of(channel)))
    url = f"http://127.0.0.1:{scheduler.metrics_port}/metrics"
    text = await asyncio.to_thread(lambda: urlopen(url, timeout=10).read().decode())
    exported = {n for n in exported_names(text) if n.startswith("rlslice_")}
    assert exported == set(catalogue.SCHEDULER)


def test_the_agent_exports_exactly_the_catalogued_metrics(catalogue: ModuleType) -> None:
    from prometheus_client import generate_latest

    from rlslice.snapshot_agent.metrics import AgentMetrics

    text = generate_latest(AgentMetrics(node="node-1").registry).decode()
    exported = {n for n in exported_names(text) if n.startswith("rlslice_")}
    assert exported == set(catalogue.AGENT)
