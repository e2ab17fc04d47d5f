"""The `AsyncClient`'s declared state and the small helpers every part of it uses.

`AsyncClient` (`_async_client`) sets these fields in its constructor; its phases' shared
holds (`_phase_holds`) build on this class. Whether the client is disabled is decided once,
here (`connect`): a client with a scheduler has its `Wired` parts, a disabled one has none.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import dataclass

from rlslice._errors import FailedPreconditionError
from rlslice.client._agent import register_with_local_agent
from rlslice.client._backoff import Backoff
from rlslice.client._connection import SchedulerConnection
from rlslice.client._give_back import GiveBacks
from rlslice.client._holds import Holds
from rlslice.client._leases import Lease, Leases, YieldRequestedCallback
from rlslice.client._lock_calls import LockCalls
from rlslice.client._results import YieldResult
from rlslice.client._settings import ClientSettings
from rlslice.client._wire import SchedulerWire

log = logging.getLogger("rlslice.client")

#: Seconds a call other than Acquire keeps retrying while the scheduler is unreachable.
RETRY_SECONDS = 30.0


@dataclass(frozen=True)
class Wired:
    """The parts of a client that talk to its scheduler."""

    wire: SchedulerWire
    leases: Leases
    lock_calls: LockCalls
    give_backs: GiveBacks


def connect(
    settings: ClientSettings, on_yield_requested: YieldRequestedCallback | None
) -> tuple[Wired | None, Holds]:
    """A client's wired parts (None when no scheduler is configured: disabled) and holds.

    Nothing touches the network here: the channel opens on the first call."""
    if settings.scheduler is None:
        log.info(
            "no scheduler configured (scheduler= or RLSLICE_SCHEDULER): client disabled, every call passes through"
        )
        return None, Holds(settings.job, None, None)
    connection = SchedulerConnection(
        settings.scheduler,
        tls=settings.tls,
        token=settings.token,
        backoff=Backoff(),
        retry_seconds=RETRY_SECONDS,
    )
    # One session per client object: its waits and holds are one thread of control for
    # the scheduler's deadlock check, apart from other processes of the job.
    wire = SchedulerWire(connection, settings, session=secrets.token_hex(8))
    leases = Leases(wire, settings, on_yield_requested)
    lock_calls = LockCalls(wire, leases, settings.job)
    holds = Holds(settings.job, leases, lock_calls)
    leases.subscribe(holds.registered_again)
    give_backs = GiveBacks(wire, settings.job, holds.holds)
    return Wired(wire, leases, lock_calls, give_backs), holds


class ClientCore:
    """The client's fields (set by `AsyncClient.__init__`) and shared helpers."""

    _settings: ClientSettings
    _wired: Wired | None
    _holds: Holds
    _agent_registered: bool
    _agent_lock: asyncio.Lock
    _closed: bool

    @property
    def job(self) -> str:
        """The job id ("" for a disabled client given none)."""
        return self._settings.job

    def _group(self, group: str | None) -> str:
        if self._wired is None and not group and self._settings.group is None:
            return ""  # a disabled client needs no group
        return self._settings.group_or_default(group)

    def _lease_of(self, group: str) -> Lease | None:
        return None if self._wired is None else self._wired.leases.peek(group)

    def _check_open(self) -> None:
        if self._closed:
            raise FailedPreconditionError("client: closed")

    async def _yield(self, wired: Wired, group: str, deadline: float | None) -> YieldResult:
        self._holds.given_up(group)  # known to hold only until the lock is given up
        return await wired.lock_calls.yield_(group, deadline)

    async def _start(self, group: str) -> None:
        socket_path = self._settings.agent_socket
        if self._agent_registered or not socket_path:
            return
        async with self._agent_lock:
            if not self._agent_registered:
                await register_with_local_agent(socket_path, self.job, group)
                self._agent_registered = True
