"""Bringing a fenced holder home once the scheduler can be reached again.

A holder whose lease lapsed (a partition, a stall) is fenced: its processes are frozen and
its state parked before anyone else is granted. The job itself may never make its next
client call: a driver waiting for its frozen worker's answer, or a process whose CUDA calls
block under a checkpoint lock, waits for good. So when the keep-alive finds the lease
unknown and registers again while the job still held the group, the client queues one
Acquire of its own (phase "homecoming"). Its grant restores the parked copy and resumes the
processes, so the job's code runs on; the lock it held is still reported lost
(`LockLostError` at the phase's exit or at `yield_()`), because work under the old grant
spanned a fence. Settling a homecoming (at that exit, or at an acquire) cancels it if it is
still queued and gives back the group it holds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from rlslice._errors import RlsliceError
from rlslice.client._results import Grant

log = logging.getLogger("rlslice.client")

#: The phase name a homecoming Acquire carries (timelines show it).
HOMECOMING_PHASE = "homecoming"
#: Seconds a settle keeps trying to give the homecoming's group back.
GIVE_BACK_SECONDS = 5.0


class Homecomings:
    """The homecoming Acquires of one client, one per group at most."""

    def __init__(
        self,
        acquire: Callable[[str], Awaitable[Grant]],
        give_back: Callable[[str, float], Awaitable[object]],
    ) -> None:
        self._acquire = acquire
        self._give_back = give_back
        self._tasks: dict[str, asyncio.Task[Grant | None]] = {}
        self._closed = False

    def start(self, group: str, job: str) -> None:
        """Queue `job` in `group` to bring its (maybe fenced) state home."""
        if self._closed or group in self._tasks:
            return
        log.warning(
            "job %r held group %r when its lease lapsed: queued to bring its state home "
            "(the lock is lost; the phase raises LockLostError at its exit)",
            job,
            group,
        )
        self._tasks[group] = asyncio.create_task(
            self._come_home(group), name=f"rlslice-homecoming-{group}"
        )

    def outstanding(self, group: str) -> bool:
        """Whether a homecoming in `group` is queued or holds the group."""
        return group in self._tasks

    async def _come_home(self, group: str) -> Grant | None:
        try:
            grant = await self._acquire(group)
        except Exception as error:  # the job's next acquire tries again
            log.warning("bringing the state home in group %r failed: %s", group, error)
            return None
        log.info(
            "state home in group %r at epoch %d (restored: %s)", group, grant.epoch, grant.restored
        )
        return grant

    async def settle(self, group: str) -> None:
        """End the homecoming in `group`: cancel it while queued, give back what it holds."""
        task = self._tasks.pop(group, None)
        if task is None:
            return
        if not task.done():
            task.cancel()
        outcome = (await asyncio.gather(task, return_exceptions=True))[0]
        if not (isinstance(outcome, Grant) or task.cancelled()):
            return  # it failed: it holds nothing
        # Granted, or cancelled in the instant it was granted: give the group back. A Yield
        # refused because the job holds nothing is the queued case, and fine.
        loop = asyncio.get_running_loop()
        try:
            await self._give_back(group, loop.time() + GIVE_BACK_SECONDS)
        except RlsliceError as error:
            log.debug("homecoming in group %r held nothing to give back: %s", group, error)

    async def close(self) -> None:
        """Cancel every homecoming (closing the client releases whatever they held)."""
        self._closed = True
        tasks, self._tasks = list(self._tasks.values()), {}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
