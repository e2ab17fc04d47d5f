"""Giving back a grant the caller never read.

An acquire that is cancelled or times out cancels its Acquire call, and the scheduler
takes the job out of the queue, or yields for it when the grant was decided while the call
was still open there. A grant already answered is out of the scheduler's reach: the answer
is on its way (or sits in the client's channel) when the caller leaves, so the scheduler
has the job holding, keeps its lease alive and serves nobody else, and the job's own next
acquire is refused ALREADY_EXISTS. The client gives such a grant back itself: it asks the
scheduler whether the job holds the group and, if so, yields it. While the job still
shows in the queue the scheduler has not yet seen the cancelled call; it asks again until
it has (a grant decided meanwhile is then one of the two cases above).

The cancelled acquire waits for its give-back before it propagates, so the job's next call
finds the group settled; a second cancellation ends that wait but not the give-back, which
the next acquire of the group waits for instead.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from rlslice._errors import FailedPreconditionError, RlsliceError
from rlslice.client._leases import LEASE_UNKNOWN, Lease
from rlslice.client._wire import SchedulerWire

log = logging.getLogger("rlslice.client")

#: Seconds a give-back keeps asking (an unreachable scheduler, or one slow to see the cancel).
GIVE_BACK_SECONDS = 5.0
#: Errors with which a Yield says there is nothing to give back: the scheduler gave the
#: group back itself, or the lease is gone with it.
GIVEN_BACK: tuple[type[RlsliceError], ...] = (FailedPreconditionError, *LEASE_UNKNOWN)
#: Pause between two looks while the scheduler still has the job in the queue.
RECHECK_SECONDS = 0.01


class GiveBacks:
    """The give-backs of one client, at most one per group at a time."""

    def __init__(self, wire: SchedulerWire, job: str, holds: Callable[[str], bool]) -> None:
        self._wire = wire
        self._job = job
        self._holds = holds
        """Whether the client knows it holds the group (a grant it delivered): never given back."""
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._acquiring: dict[str, int] = {}

    def started(self, group: str) -> None:
        """An acquire of `group` sends its Acquire call."""
        self._acquiring[group] = self._acquiring.get(group, 0) + 1

    def ended(self, group: str) -> None:
        """That acquire ended, one way or another."""
        left = self._acquiring.get(group, 0) - 1
        if left > 0:
            self._acquiring[group] = left
        else:
            self._acquiring.pop(group, None)

    async def settle(self, group: str) -> None:
        """Wait for a give-back of `group` still under way (its acquire was cancelled twice)."""
        task = self._tasks.get(group)
        if task is not None:
            await asyncio.shield(task)

    async def give_back(self, lease: Lease) -> None:
        """The acquire under `lease` ended unread (cancelled, timed out): give back a grant
        it may have been answered. Call after `ended`."""
        group = lease.group
        if self._acquiring.get(group) or self._holds(group):
            return  # another acquire of this client is out, or the job knows it holds
        task = self._tasks.get(group)
        if task is None:
            task = asyncio.create_task(self._run(lease, lease.generation))
            self._tasks[group] = task
            task.add_done_callback(lambda done: self._forget(group, done))
        await asyncio.shield(task)

    def _forget(self, group: str, task: asyncio.Task[None]) -> None:
        if self._tasks.get(group) is task:
            del self._tasks[group]

    async def _run(self, lease: Lease, generation: int) -> None:
        loop = asyncio.get_running_loop()
        give_up = loop.time() + GIVE_BACK_SECONDS
        try:
            while True:
                status = await self._wire.group(lease.group, give_up)
                if status.holder == self._job:
                    await self._yield(lease, generation, status.epoch)
                    return
                if self._job not in status.queue or loop.time() >= give_up:
                    return
                await asyncio.sleep(RECHECK_SECONDS)
        except RlsliceError as error:
            log.warning(
                "job %r: could not make sure an unread grant of group %r was given back: %s",
                self._job,
                lease.group,
                error,
            )

    async def _yield(self, lease: Lease, generation: int, epoch: int) -> None:
        if lease.generation != generation or self._holds(lease.group):
            return  # registered again (that grant is gone), or a later acquire delivered it
        deadline = asyncio.get_running_loop().time() + GIVE_BACK_SECONDS
        try:
            await self._wire.yield_(lease, deadline, retry_seconds=None)
        except GIVEN_BACK:
            return  # the scheduler gave it back itself, or the lease is gone with it
        log.info(
            "job %r: gave back group %r (epoch %d), granted as its acquire was cancelled",
            self._job,
            lease.group,
            epoch,
        )
