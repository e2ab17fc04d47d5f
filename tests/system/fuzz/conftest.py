"""A live scheduler and a live agent for the fuzz tests, on an event loop in a thread of
their own, so hypothesis drives them from plain (synchronous) tests over real gRPC.

The scheduler has group `g` where job `a` holds the lock (its real lease is offered to
the strategies, so fuzzed calls reach deep paths, not only the first field check); the
agent has a real job process `a` in group `g` registered over its Unix socket.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from rlslice.config import GroupSpec
from rlslice.scheduler import SchedulerSettings, start_scheduler
from rlslice.snapshot_agent import AgentSettings, SimSettings, start_agent
from rlslice.v1alpha1 import scheduler_pb2 as pb
from rlslice.v1alpha1 import scheduler_pb2_grpc

WORKER = Path(__file__).parents[1] / "faults" / "worker.py"
T = TypeVar("T")

#: Codes that mean "the server did not handle this input": never acceptable.
BROKEN = {
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.DATA_LOSS,
}


class Loop:
    """An asyncio loop in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


@dataclass
class LiveScheduler:
    loop: Loop
    running: Any
    channel: grpc.Channel
    stub: Any
    lease: pb.RegisterResponse

    def states(self) -> dict[str, Any]:
        async def read() -> dict[str, Any]:
            return {name: r.state for name, r in self.running.engine.groups.items()}

        return self.loop.run(read())


@dataclass
class LiveAgent:
    loop: Loop
    running: Any
    channel: grpc.Channel
    worker: subprocess.Popen[bytes]

    def records(self) -> dict[str, Any]:
        """The job records, once every move the agent started has ended (a move runs on in
        a task of its own after its call is answered or cut: reading before it ends would
        see a change no later call made)."""

        async def read() -> dict[str, Any]:
            engine = self.running.engine
            while engine._tasks:
                await asyncio.gather(*list(engine._tasks), return_exceptions=True)
            return {job: e.record for job, e in engine.table.entries.items()}

        return self.loop.run(read())


@pytest.fixture(scope="module")
def loop() -> Iterator[Loop]:
    made = Loop()
    yield made
    made.close()


@pytest.fixture(scope="module")
def live_scheduler(loop: Loop) -> Iterator[LiveScheduler]:
    settings = SchedulerSettings(address="127.0.0.1:0", groups=(GroupSpec(name="g"),))
    running = loop.run(start_scheduler(settings))
    channel = grpc.insecure_channel(running.address)
    stub = scheduler_pb2_grpc.SchedulerStub(channel)
    lease = stub.Register(pb.RegisterRequest(job="a", group="g", lease_seconds=3600))
    stub.Acquire(
        pb.AcquireRequest(job="a", group="g", lease_id=lease.lease_id, secret=lease.secret)
    )
    yield LiveScheduler(loop, running, channel, stub, lease)
    channel.close()
    loop.run(running.stop(0.1))


@pytest.fixture(scope="module")
def live_agent(loop: Loop) -> Iterator[LiveAgent]:
    short = Path(tempfile.mkdtemp(prefix="rz-", dir="/tmp"))
    shm = Path(
        tempfile.mkdtemp(
            prefix="rlslice-fuzz-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
        )
    )
    settings = AgentSettings(
        node="n1",
        state_dir=short / "state",
        socket_path=short / "n1.sock",
        host_reserve_bytes=0,
        sim=SimSettings(root=shm, capacity_bytes=8 << 20, rate_gbps=0.0),
    )
    running = loop.run(start_agent(settings))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLSLICE_")}
    env["PYTHONSAFEPATH"] = "1"
    worker = subprocess.Popen(
        [sys.executable, str(WORKER), "worker", str(settings.socket_path), str(shm / "n1"), "a", "g"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )  # fmt: skip
    assert worker.stdin is not None
    assert worker.stdout is not None
    json.loads(worker.stdout.readline())
    worker.stdin.write(b'{"op": "init", "size": 1048576, "seed": 1}\n')
    worker.stdin.flush()
    assert json.loads(worker.stdout.readline())["ok"]
    # The agent's port is never open: every call carries its token.
    channel = grpc.intercept_channel(
        grpc.insecure_channel(running.address), _BearerToken(running.token)
    )
    yield LiveAgent(loop, running, channel, worker)
    channel.close()
    worker.kill()
    worker.wait(10)
    loop.run(running.stop(0))
    shutil.rmtree(short, ignore_errors=True)
    shutil.rmtree(shm, ignore_errors=True)


class _BearerToken(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """`authorization: Bearer <token>` on every call of a synchronous channel."""

    def __init__(self, token: str) -> None:
        self._metadata = ("authorization", f"Bearer {token}")

    def _details(self, details: Any) -> Any:
        metadata = [*(details.metadata or ()), self._metadata]
        return details._replace(metadata=metadata)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)


def serving(channel: grpc.Channel) -> bool:
    """The server's health check answers SERVING."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)
