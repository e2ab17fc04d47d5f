"""Announce the agent to its scheduler, and again whenever the scheduler comes back.

Each answer lists the jobs the scheduler knows in this node's groups; `on_registered`
gets it, so the agent can drop parked state whose Release it never heard (it was down).

After a successful RegisterAgent the link waits on the channel's connectivity (no
polling): when the connection to the scheduler drops and a new one is made, it registers
again, and it renews every `renew_seconds` anyway (the scheduler expires a silent agent).
Failed attempts are retried with capped exponential backoff and jitter.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from rlslice.adapters.channel import open_channel
from rlslice.config import TLSConfig
from rlslice.v1alpha1 import scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger(__name__)


class SchedulerLink:
    """Keeps this agent registered with the scheduler at `address`."""

    def __init__(
        self,
        address: str,
        request: Callable[[], Awaitable[scheduler_pb2.RegisterAgentRequest]],
        *,
        tls: TLSConfig | None = None,
        token: str | None = None,
        initial_backoff: float = 0.1,
        max_backoff: float = 5.0,
        on_registered: Callable[[scheduler_pb2.RegisterAgentResponse], Awaitable[object]]
        | None = None,
        renew_seconds: float = 30.0,
    ) -> None:
        self._address = address
        self._request = request
        self._tls = tls
        self._token = token
        self._initial = initial_backoff
        self._max = max_backoff
        self._on_registered = on_registered
        self._renew = renew_seconds
        """Registers again at least this often: the scheduler expires a silent agent."""
        self._task: asyncio.Task[None] | None = None
        self.registrations = 0
        """Successful RegisterAgent calls so far."""
        self.groups: tuple[str, ...] = ()
        """Groups the scheduler said this node takes part in, at the last registration."""
        self._registered = asyncio.Event()
        self._stub: Any = None
        self._node = ""
        self._stopping = False
        """Set by stop(): a cancelled RPC can surface as an RpcError (CANCELLED) rather than
        CancelledError, and the retry loop must not take it for a scheduler outage."""

    def start(self) -> None:
        """Begin registering in the background."""
        self._task = asyncio.ensure_future(self._run())

    async def wait_registered(self, timeout: float) -> bool:
        """True once a registration has succeeded (within `timeout` seconds)."""
        try:
            await asyncio.wait_for(self._registered.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def stop(self, unregister: bool = True) -> None:
        """Stop the background task; first, when registered and `unregister`, tell the
        scheduler this node leaves (UnregisterAgent; refused while a job's state is here)."""
        if unregister and self._stub is not None and self._node and self.registrations:
            try:
                await self._stub.UnregisterAgent(
                    scheduler_pb2.UnregisterAgentRequest(node=self._node), timeout=2.0
                )
                log.info("unregistered node %s from scheduler %s", self._node, self._address)
            except grpc.RpcError as error:
                details = error.details() if isinstance(error, grpc.aio.AioRpcError) else ""
                log.info("node %s stays registered: %s", self._node, details or error)
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        channel = open_channel(self._address, tls=self._tls, token=self._token)
        stub: Any = scheduler_pb2_grpc.SchedulerStub(channel)
        self._stub = stub
        delay = self._initial
        try:
            while not self._stopping:
                try:
                    request = await self._request()
                    response = await stub.RegisterAgent(request, timeout=10.0, wait_for_ready=False)
                except grpc.RpcError as error:
                    self._raise_if_stopping()
                    code = error.code() if isinstance(error, grpc.aio.AioRpcError) else None
                    log.info(
                        "scheduler %s: registration failed (%s); retrying in %.1fs",
                        self._address,
                        code,
                        delay,
                    )
                    await asyncio.sleep(delay * (0.8 + 0.2 * random.random()))
                    delay = min(self._max, delay * 2)
                    continue
                delay = self._initial
                self._node = request.node
                self.registrations += 1
                self.groups = tuple(response.groups)
                self._registered.set()
                log.info(
                    "registered with scheduler %s (groups: %s)",
                    self._address,
                    ", ".join(self.groups) or "none",
                )
                if self._on_registered is not None:
                    try:
                        await self._on_registered(response)
                    except Exception:  # the link must outlive any one failure
                        log.exception("acting on the registration's answer failed")
                try:
                    await asyncio.wait_for(self._until_reconnected(channel), self._renew)
                except TimeoutError:
                    pass  # renew: the scheduler expires an agent it has not heard from
                self._raise_if_stopping()
        finally:
            self._stub = None
            await channel.close(None)

    def _raise_if_stopping(self) -> None:
        """Re-raise a cancellation that an RPC or wait_for turned into something else."""
        task = asyncio.current_task()
        if self._stopping or (task is not None and task.cancelling()):
            raise asyncio.CancelledError

    @staticmethod
    async def _until_reconnected(channel: grpc.aio.Channel) -> None:
        """Return once the connection has dropped and the channel tries again."""
        state = channel.get_state(try_to_connect=True)
        while state is grpc.ChannelConnectivity.READY:
            await channel.wait_for_state_change(state)
            state = channel.get_state(try_to_connect=True)
