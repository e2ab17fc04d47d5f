"""A scheduler's channel played from a script, for tests of the client's wire and holds.

Each call of a method answers the next item of that method's script: a reply, a gRPC
status raised as the channel would, or a coroutine function of the request that gives
either (to hold a call in flight). Nothing listens on the network.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import Message

from rlslice.client._backoff import Backoff
from rlslice.client._connection import SchedulerConnection
from rlslice.client._settings import resolve_settings
from rlslice.client._wire import SchedulerWire

Answer = Message | grpc.StatusCode
Step = Answer | Callable[[Message], Awaitable[Answer]]


class ScriptedLease:
    """Lease credentials in group "gpus"."""

    group = "gpus"
    lease_id = "lease-1"
    secret = "secret-1"


class ScriptedStub:
    """Answers each method's calls from its script, in order; records what was asked."""

    def __init__(self, scripts: dict[str, list[Step]]) -> None:
        self._scripts = scripts
        self.asked: list[str] = []
        self.requests: list[tuple[str, Message]] = []

    def __getattr__(self, method: str) -> Callable[..., Any]:
        async def call(request: Message, timeout: float | None = None) -> Message:
            self.asked.append(method)
            self.requests.append((method, request))
            step = self._scripts[method].pop(0)
            if callable(step):
                step = await step(request)
            if isinstance(step, grpc.StatusCode):
                raise grpc.aio.AioRpcError(
                    step, grpc.aio.Metadata(), grpc.aio.Metadata(), details=step.name.lower()
                )
            return step

        return call


def scripted_wire(scripts: dict[str, list[Step]]) -> tuple[SchedulerWire, ScriptedStub]:
    """A wire whose channel is a `ScriptedStub` of `scripts` (job "a", group "gpus")."""
    connection = SchedulerConnection(
        "127.0.0.1:1",
        tls=None,
        token=None,
        backoff=Backoff(initial=0.001, cap=0.001),
        retry_seconds=5.0,
    )
    stub = ScriptedStub(scripts)
    connection._stub = stub  # the channel opens lazily: this one never does
    settings = resolve_settings(
        job="a",
        group="gpus",
        scheduler="127.0.0.1:1",
        lease_seconds=None,
        token=None,
        tls=None,
        priority=None,
        weight=None,
        env={},
    )
    return SchedulerWire(connection, settings, session="s"), stub
