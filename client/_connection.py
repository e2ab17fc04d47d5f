"""The client's channel to the scheduler: opened lazily, calls retried across restarts.

A scheduler restart shows up as UNAVAILABLE. The channel reconnects by itself (with a short
reconnect backoff set below); this module retries the call with capped exponential backoff
until the caller's deadline or the retry budget runs out. Failures come out as the typed
rlslice errors of `rlslice.adapters.grpc_errors`, the one translator. The calls themselves
(their protobuf, their method names) are built in `client._wire`, the one module that does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import grpc
from google.protobuf.message import Message

from rlslice._errors import (
    DeadlineExceededError,
    FailedPreconditionError,
    RlsliceError,
    UnavailableError,
)
from rlslice.adapters.channel import open_channel
from rlslice.adapters.grpc_errors import error_from_rpc
from rlslice.client._backoff import Backoff
from rlslice.config import TLSConfig
from rlslice.v1alpha1 import scheduler_pb2_grpc

log = logging.getLogger("rlslice.client")

T = TypeVar("T", bound=Message)

# The channel's own reconnect backoff grows to two minutes by default; a restarted
# scheduler should be found within a couple of seconds.
RECONNECT_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
)


#: Seconds of failed attempts after which a call logs that the scheduler is unreachable.
WARN_AFTER_SECONDS = 5.0


@dataclass(frozen=True)
class Landed:
    """An earlier attempt of a call did what was asked, its answer lost in an outage: the
    server refuses the repeat with `error` (an Acquire with ALREADY_EXISTS, say)."""

    error: RlsliceError


class SchedulerConnection:
    """One channel to one scheduler, shared by every group a client uses."""

    def __init__(
        self,
        address: str,
        *,
        tls: TLSConfig | None,
        token: str | None,
        backoff: Backoff,
        retry_seconds: float,
    ) -> None:
        self.address = address
        self._tls = tls
        self._token = token
        self._backoff = backoff
        self._retry_seconds = retry_seconds
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None
        self._closed = False
        self._closed_event = asyncio.Event()  # wakes calls sleeping between retries

    def _ensure_open(self) -> Any:
        if self._closed:  # ends calls (an acquire retrying, say) that outlive close()
            raise FailedPreconditionError("client: closed")
        # grpc.aio binds a channel to the running loop, so it is made on first use.
        if self._stub is None:
            self._channel = open_channel(
                self.address, tls=self._tls, token=self._token, options=RECONNECT_OPTIONS
            )
            self._stub = scheduler_pb2_grpc.SchedulerStub(self._channel)
        return self._stub

    async def close(self) -> None:
        """Close the channel for good; calls in flight are cancelled, later ones refused."""
        self._closed = True
        self._closed_event.set()
        channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            await channel.close(None)

    async def once(
        self, method: str, request: Message, response: type[T], *, timeout: float | None
    ) -> T:
        """One attempt of `method`; a gRPC error is raised as its rlslice error."""
        stub = self._ensure_open()
        try:
            answer = await getattr(stub, method)(request, timeout=timeout)
        except grpc.aio.AioRpcError as error:
            raise error_from_rpc(error) from error
        return cast(T, answer)

    async def call(
        self,
        method: str,
        request: Message,
        response: type[T],
        *,
        deadline: float | None = None,
        retry_seconds: float | None = None,
        what: str = "",
    ) -> T:
        """`method` retried on UNAVAILABLE until `deadline` (loop time) or the retry budget.

        `retry_seconds` None takes the connection's default budget; `float("inf")` retries
        until the deadline. Any other failure raises its rlslice error at once.
        """
        answer = await self.call_landing(
            method, request, response, deadline=deadline, retry_seconds=retry_seconds, what=what
        )
        assert not isinstance(answer, Landed)  # nothing counts as landed here
        return answer

    async def call_landing(
        self,
        method: str,
        request: Message,
        response: type[T],
        *,
        deadline: float | None = None,
        retry_seconds: float | None = None,
        what: str = "",
        landed: tuple[type[RlsliceError], ...] = (),
    ) -> T | Landed:
        """`call`; an error of a type in `landed` after an attempt found the scheduler
        unreachable is returned as `Landed`: that attempt may have done what was asked."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        budget = self._retry_seconds if retry_seconds is None else retry_seconds
        delays = self._backoff.delays()
        unreachable: str | None = None  # why the last attempt found no scheduler
        warned = False
        while True:
            timeout = None if deadline is None else deadline - loop.time()
            if timeout is not None and timeout <= 0:
                why = (
                    f"; scheduler {self.address} unreachable: {unreachable}" if unreachable else ""
                )
                raise DeadlineExceededError(f"{what or method}: deadline passed{why}")
            try:
                return await self.once(method, request, response, timeout=timeout)
            except UnavailableError as error:
                if loop.time() >= started + budget:
                    raise
                unreachable = str(error)
            except landed as error:
                if unreachable is None:
                    raise
                return Landed(error)
            if not warned and loop.time() - started > WARN_AFTER_SECONDS:
                # Say so once: a restart takes seconds, a wrong address or TLS setup forever.
                log.warning(
                    "%s: scheduler %s unreachable for %.0f s, still retrying: %s",
                    what or method,
                    self.address,
                    loop.time() - started,
                    unreachable,
                )
                warned = True
            delay = next(delays)
            if deadline is not None:
                delay = max(0.0, min(delay, deadline - loop.time()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closed_event.wait(), delay)
