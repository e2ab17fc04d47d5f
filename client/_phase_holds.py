"""The `AsyncClient`'s phases: nested and concurrent phases of a client share one hold.

A hold (`client._holds.GroupHold`) acquires its group when its first phase enters and
yields it when its last leaves; a lease registered again under a hold means its lock was
lost (LockLostError), and the state of a lost hold is brought home.
"""

from __future__ import annotations

import asyncio
import logging

from rlslice._errors import (
    DeadlineExceededError,
    NotFoundError,
    PermissionDeniedError,
    UnavailableError,
)
from rlslice.client._client_core import ClientCore
from rlslice.client._holds import GroupHold
from rlslice.client._phase import LAPSED_YIELD_SECONDS, lock_lost
from rlslice.client._results import Grant

log = logging.getLogger("rlslice.client")


class PhaseHoldsMixin(ClientCore):
    """`AsyncClient`'s phase entries and exits over shared holds."""

    async def acquire(
        self, timeout: float | None = None, group: str | None = None, phase: str = ""
    ) -> Grant:
        """`AsyncClient.acquire` (defined there)."""
        raise NotImplementedError

    async def _enter_phase(self, name: str, group: str) -> Grant:
        hold = self._holds.of(group)
        async with hold.lock:
            if hold.phases == 0:
                hold.grant = await self.acquire(group=group, phase=name)
            else:
                # A nested phase is the job's next call under the hold: a lost lock says so.
                self._check_hold(hold)
            hold.phases += 1
            assert hold.grant is not None
            return hold.grant

    async def _exit_phase(self, group: str) -> None:
        hold = self._holds.of(group)
        async with hold.lock:
            hold.phases -= 1
            if hold.phases > 0:
                return
            grant = hold.grant
            if self._holds.lost(hold):
                await self._holds.end_lost(group)
            self._check_hold(hold)
            wired = self._wired
            if self._closed or wired is None:
                return
            lease = self._lease_of(group)
            loop = asyncio.get_running_loop()
            lapsed = lease is not None and lease.lapsed(loop.time())
            # Past the lease deadline with no renewal answered, a long retry would only hide
            # the loss: try briefly, then report it.
            deadline = loop.time() + LAPSED_YIELD_SECONDS if lapsed else None
            try:
                await self._yield(wired, group, deadline)
            except (NotFoundError, PermissionDeniedError) as error:
                # The scheduler no longer knows the lease (it lapsed, or a scheduler with an
                # in-memory store restarted without it): someone else may hold the group.
                raise lock_lost(self.job, group, grant, str(error)) from None
            except (UnavailableError, DeadlineExceededError) as error:
                if not lapsed:
                    raise
                raise lock_lost(
                    self.job, group, grant, f"the scheduler is unreachable past the lease: {error}"
                ) from None

    def _check_hold(self, hold: GroupHold) -> None:
        """Raise LockLostError when the lease the hold was granted under is gone."""
        if self._holds.lost(hold):
            log.warning(
                "job %r lost group %r during a phase (its lease lapsed)", self.job, hold.group
            )
            raise lock_lost(
                self.job,
                hold.group,
                hold.grant,
                "its lease lapsed and was registered again",
            )

    async def _enter_phases(self, name: str, groups: tuple[str, ...]) -> dict[str, Grant]:
        """Enter each group's phase in the given (canonical) order; on any failure leave
        the ones entered, then let the failure propagate."""
        self._check_open()
        default = self._settings.group
        if default is not None and default in groups:
            # The process joins the local agent once, in one group: the default group is
            # the one this pod or `rlslice run` placed it in; the first acquire would
            # otherwise pick the first group in sorted order.
            await self._start(default)
        grants: dict[str, Grant] = {}
        try:
            for group in groups:
                grants[group] = await self._enter_phase(name, group)
        except BaseException:
            # Shielded: a second cancellation must not leave a group held.
            await asyncio.shield(self._leave(tuple(grants), quiet=True))
            raise
        return grants

    async def _exit_phases(self, groups: tuple[str, ...]) -> None:
        await self._leave(groups, quiet=False)

    async def _leave(self, groups: tuple[str, ...], *, quiet: bool) -> None:
        """Leave each group's phase, last entered first. A failure to leave one does not
        keep the others held: the first is raised after all were tried (logged when
        `quiet`, because another error is on its way)."""
        first: Exception | None = None
        for group in reversed(groups):
            try:
                await self._exit_phase(group)
            except Exception as error:
                log.warning("job %r: leaving group %r failed: %s", self.job, group, error)
                first = first or error
        if first is not None and not quiet:
            raise first
