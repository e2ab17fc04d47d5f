"""A client's lock calls: Acquire across lease renewals, and Yield.

An Acquire is retried across lease renewals and scheduler restarts (`client._wire` reads
back a grant whose answer a restart lost); one answered after its lease lapsed is acquired
anew.
"""

from __future__ import annotations

import asyncio
import logging
import math

from rlslice._errors import FailedPreconditionError
from rlslice.client._leases import LEASE_UNKNOWN, Lease, Leases
from rlslice.client._results import Grant, YieldResult
from rlslice.client._wire import SchedulerWire

log = logging.getLogger("rlslice.client")


class LockCalls:
    """Acquire and Yield for one client's job, under the leases it keeps."""

    def __init__(self, wire: SchedulerWire, leases: Leases, job: str) -> None:
        self._wire = wire
        self._leases = leases
        self._job = job

    async def acquire(
        self, lease: Lease, phase: str, deadline: float | None, started: float
    ) -> Grant:
        """Wait for the grant of `lease`'s group until `deadline` (loop time), registering
        again when the scheduler no longer knows the lease; `started` is when the caller
        began waiting."""
        renewed = False
        while True:
            generation = lease.generation
            try:
                grant = await self._wire.acquire(lease, phase, deadline, started)
            except LEASE_UNKNOWN:
                if renewed and lease.generation == generation:
                    raise
                # The lease lapsed (or a restarted scheduler forgot it): register once more.
                renewed = renewed or lease.generation == generation
                await self._leases.renew(lease, generation, deadline)
                continue
            if await self._granted_under_live_lease(lease, generation, deadline):
                return grant
            # The answer came back after the lease had lapsed (a partition cut it on its
            # way): the scheduler fenced or released that grant. Acquire anew.
            log.warning(
                "job %r: the grant of group %r at epoch %d came after its lease lapsed; "
                "acquiring again",
                self._job,
                lease.group,
                grant.epoch,
            )
            await self._leases.renew(lease, generation, deadline)

    async def _granted_under_live_lease(
        self, lease: Lease, generation: int, deadline: float | None
    ) -> bool:
        """Whether the lease an Acquire was answered under still lives. Past its local
        deadline (no renewal answered for a ttl) only a KeepAlive can tell."""
        if lease.generation != generation:
            return False  # registered again while the Acquire was out: that lease is gone
        if not lease.lapsed(asyncio.get_running_loop().time()):
            return True  # the scheduler's deadline is later still
        return await self._leases.alive(lease, deadline)

    async def yield_(self, group: str, deadline: float | None) -> YieldResult:
        """Give `group` up; with a `deadline`, retried through an outage until it passes."""
        lease = self._leases.peek(group)
        if lease is None:
            raise FailedPreconditionError(
                f"group: job {self._job!r} does not hold {group!r} (it never acquired it)"
            )
        retry = None if deadline is None else math.inf
        return await self._wire.yield_(lease, deadline, retry_seconds=retry)
