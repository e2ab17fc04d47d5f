"""What a client holds, one `GroupHold` per group, and bringing a fenced holder home.

A hold knows the grant the job was given, the generation of the lease it was granted under
(a later generation means the lock was lost), how many of the client's phases are inside
the group, and its homecoming, if one runs.

Homecoming. A holder whose lease lapsed (a partition, a stall) is fenced: its processes are
frozen and its state parked before anyone else is granted. The job itself may never make
its next client call: a driver waiting for its frozen worker's answer, or a process whose
CUDA calls block under a checkpoint lock, waits for good. So when the keep-alive registers
a group again (`Leases.subscribe`) while the job still held it, the hold queues one Acquire
of its own (phase "homecoming"). Its grant restores the parked copy and resumes the
processes, so the job's code runs on; the lock it held is still reported lost
(`LockLostError` at the phase's exit or at `yield_()`), because work under the old grant
spanned a fence. Settling a homecoming (at that exit, or at an acquire) cancels it if it is
still queued and gives back the group it holds.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from rlslice._errors import RlsliceError
from rlslice.client._leases import Leases
from rlslice.client._lock_calls import LockCalls
from rlslice.client._results import Grant

log = logging.getLogger("rlslice.client")

#: The phase name a homecoming Acquire carries (timelines show it).
HOMECOMING_PHASE = "homecoming"
#: Seconds a settle keeps trying to give the homecoming's group back.
GIVE_BACK_SECONDS = 5.0


@dataclass(eq=False)
class GroupHold:
    """The client's hold on one group. Mutated only on the client's event loop."""

    group: str
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Serialises the phases' entries and exits."""
    grant: Grant | None = None
    """The latest grant the job was given in the group."""
    held: bool = False
    """Whether the job holds the group under `grant`: acquired, not yielded, not lost."""
    generation: int = 0
    """The generation of the lease `grant` came under."""
    phases: int = 0
    """How many of the client's phases are inside the group (they share one grant)."""
    homecoming: asyncio.Task[Grant | None] | None = None
    """The Acquire bringing the state of a lost hold home, while one runs or holds."""


class Holds:
    """The holds of one client. `leases` and `lock_calls` are None for a disabled client,
    whose holds only count its phases."""

    def __init__(self, job: str, leases: Leases | None, lock_calls: LockCalls | None) -> None:
        self._job = job
        self._leases = leases
        self._lock_calls = lock_calls
        self._holds: dict[str, GroupHold] = {}
        self._closed = False

    def of(self, group: str) -> GroupHold:
        """The hold on `group` (an empty one the first time)."""
        hold = self._holds.get(group)
        if hold is None:
            hold = self._holds[group] = GroupHold(group)
        return hold

    def granted(self, group: str, grant: Grant) -> None:
        """The job was given `grant` under the lease it now has in `group`."""
        hold = self.of(group)
        lease = None if self._leases is None else self._leases.peek(group)
        hold.grant, hold.held = grant, True
        hold.generation = lease.generation if lease is not None else 0

    def given_up(self, group: str) -> None:
        """The job gives `group` up (a yield on its way): it no longer holds it."""
        hold = self._holds.get(group)
        if hold is not None:
            hold.held = False

    def holds(self, group: str) -> bool:
        """Whether the client knows it holds `group` (a grant it delivered)."""
        hold = self._holds.get(group)
        return hold is not None and hold.held

    def lost(self, hold: GroupHold) -> bool:
        """Whether the lease of the hold's group was registered again since its grant."""
        lease = None if self._leases is None else self._leases.peek(hold.group)
        return lease is not None and lease.generation != hold.generation

    def registered_again(self, group: str) -> None:
        """The keep-alive registered `group` again: a lock the job held there is lost, and
        its state may be fenced while its code waits on it; bring it home."""
        hold = self._holds.get(group)
        if hold is None or not hold.held or self._closed or not self.lost(hold):
            return
        if hold.homecoming is not None:
            return
        log.warning(
            "job %r held group %r when its lease lapsed: queued to bring its state home "
            "(the lock is lost; the phase raises LockLostError at its exit)",
            self._job,
            group,
        )
        hold.homecoming = asyncio.create_task(
            self._come_home(group), name=f"rlslice-homecoming-{group}"
        )

    def coming_home(self, group: str) -> bool:
        """Whether a homecoming in `group` is queued or holds the group."""
        hold = self._holds.get(group)
        return hold is not None and hold.homecoming is not None

    async def end_lost(self, group: str) -> None:
        """Forget a hold whose lock was lost, and end its homecoming (`settle`)."""
        self.given_up(group)
        await self.settle(group)

    async def _come_home(self, group: str) -> Grant | None:
        assert self._leases is not None
        assert self._lock_calls is not None
        loop = asyncio.get_running_loop()
        try:
            lease = await self._leases.get(group, None)
            grant = await self._lock_calls.acquire(lease, HOMECOMING_PHASE, None, loop.time())
        except Exception as error:  # the job's next acquire tries again
            log.warning("bringing the state home in group %r failed: %s", group, error)
            return None
        log.info(
            "state home in group %r at epoch %d (restored: %s)", group, grant.epoch, grant.restored
        )
        return grant

    async def settle(self, group: str) -> None:
        """End the homecoming in `group`: cancel it while queued, give back what it holds."""
        hold = self._holds.get(group)
        task = None if hold is None else hold.homecoming
        if hold is None or task is None:
            return
        hold.homecoming = None
        if not task.done():
            task.cancel()
        outcome = (await asyncio.gather(task, return_exceptions=True))[0]
        if not (isinstance(outcome, Grant) or task.cancelled()):
            return  # it failed: it holds nothing
        # Granted, or cancelled in the instant it was granted: give the group back. A Yield
        # refused because the job holds nothing is the queued case, and fine.
        assert self._lock_calls is not None
        self.given_up(group)
        loop = asyncio.get_running_loop()
        try:
            await self._lock_calls.yield_(group, loop.time() + GIVE_BACK_SECONDS)
        except RlsliceError as error:
            log.debug("homecoming in group %r held nothing to give back: %s", group, error)

    async def close(self) -> None:
        """Cancel every homecoming (closing the client gives up whatever they held)."""
        self._closed = True
        tasks = [h.homecoming for h in self._holds.values() if h.homecoming is not None]
        for hold in self._holds.values():
            hold.homecoming = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
