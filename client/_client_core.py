"""The `AsyncClient`'s declared state and the small helpers every part of it uses.

`AsyncClient` (`_async_client`) sets these fields in its constructor; its wire calls for the
lock (`_lock_calls`) and its phases' shared holds (`_phase_holds`) build on this class.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from rlslice._errors import FailedPreconditionError
from rlslice.client._agent import register_with_local_agent
from rlslice.client._connection import Connection
from rlslice.client._give_back import GiveBacks
from rlslice.client._homecoming import Homecomings
from rlslice.client._leases import Lease, Leases
from rlslice.client._results import Grant
from rlslice.client._settings import ClientSettings


@dataclass
class Hold:
    """How many phases of this client are inside a group, and the grant they share."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    count: int = 0
    grant: Grant | None = None
    generation: int = 0


@dataclass(frozen=True)
class Held:
    """A group the job acquired and has not yielded: its grant, and the generation of the
    lease it was granted under (a later generation means the lock was lost)."""

    grant: Grant
    generation: int


class ClientCore:
    """The client's fields (set by `AsyncClient.__init__`) and shared helpers."""

    _settings: ClientSettings
    _conn: Connection | None
    _leases: Leases | None
    _give_backs: GiveBacks | None
    _holds: dict[str, Hold]
    _held: dict[str, Held]
    _homecomings: Homecomings
    _agent_registered: bool
    _agent_lock: asyncio.Lock
    _closed: bool

    @property
    def job(self) -> str:
        """The job id ("" for a disabled client given none)."""
        return self._settings.job

    def _group(self, group: str | None) -> str:
        if self._settings.scheduler is None and not group and self._settings.group is None:
            return ""  # a disabled client needs no group
        return self._settings.group_or_default(group)

    def _lease_of(self, group: str) -> Lease | None:
        return None if self._leases is None else self._leases.peek(group)

    def _check_open(self) -> None:
        if self._closed:
            raise FailedPreconditionError("client: closed")

    async def _start(self, group: str) -> None:
        socket_path = self._settings.agent_socket
        if self._agent_registered or not socket_path:
            return
        async with self._agent_lock:
            if not self._agent_registered:
                await register_with_local_agent(socket_path, self.job, group)
                self._agent_registered = True
