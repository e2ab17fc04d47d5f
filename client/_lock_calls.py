"""The `AsyncClient`'s wire calls for the lock: Acquire (with its give-back), Yield.

An Acquire is retried across lease renewals and scheduler restarts; one answered after its
lease lapsed is acquired anew, and one granted before a restart whose answer was lost is
read back from GetGroup.
"""

from __future__ import annotations

import asyncio
import logging
import math

from rlslice._errors import AlreadyExistsError, DeadlineExceededError, FailedPreconditionError
from rlslice.client._client_core import ClientCore
from rlslice.client._connection import RpcFailed
from rlslice.client._leases import LEASE_UNKNOWN, Lease
from rlslice.client._results import Grant, YieldResult
from rlslice.v1alpha1 import scheduler_pb2 as pb

log = logging.getLogger("rlslice.client")


class LockCallsMixin(ClientCore):
    """`AsyncClient`'s Acquire and Yield calls on the wire."""

    async def _acquire_or_give_back(
        self, lease: Lease, phase: str, deadline: float | None, started: float
    ) -> Grant:
        """`_acquire`; when the caller cancels or the timeout passes, the grant may have been
        decided all the same (its answer on the way): give it back before propagating (see
        `client._give_back`), so the job neither holds the group unawares nor is refused its
        next acquire."""
        assert self._give_backs is not None
        give_backs = self._give_backs
        give_backs.started(lease.group)
        try:
            grant = await self._acquire(lease, phase, deadline, started)
        except asyncio.CancelledError:
            give_backs.ended(lease.group)
            if not self._closed:  # close() unregisters, which gives everything back
                await give_backs.give_back(lease)
            raise
        except RpcFailed as failed:
            give_backs.ended(lease.group)
            if isinstance(failed.error, DeadlineExceededError) and not self._closed:
                await give_backs.give_back(lease)
            raise
        except BaseException:
            give_backs.ended(lease.group)
            raise
        give_backs.ended(lease.group)
        return grant

    async def _acquire(
        self, lease: Lease, phase: str, deadline: float | None, started: float
    ) -> Grant:
        assert self._conn is not None
        assert self._leases is not None
        renewed = False
        while True:
            generation = lease.generation
            request = pb.AcquireRequest(
                job=self.job,
                group=lease.group,
                lease_id=lease.lease_id,
                secret=lease.secret,
                phase=phase,
            )
            try:
                answer = await self._conn.call(
                    "Acquire", request, pb.Grant, deadline=deadline, retry_seconds=math.inf
                )
                grant = _grant(answer, lease.group, self.job)
                if await self._granted_under_live_lease(lease, generation, deadline):
                    return grant
                # The answer came back after the lease had lapsed (a partition cut it on
                # its way): the scheduler fenced or released that grant. Acquire anew.
                log.warning(
                    "job %r: the grant of group %r at epoch %d came after its lease lapsed; "
                    "acquiring again",
                    self.job,
                    lease.group,
                    grant.epoch,
                )
                await self._leases.renew(lease, generation, deadline)
                continue
            except RpcFailed as failed:
                if isinstance(failed.error, LEASE_UNKNOWN) and (
                    not renewed or lease.generation != generation
                ):
                    # The lease lapsed (or a restarted scheduler forgot it): register once more.
                    renewed = renewed or lease.generation == generation
                    await self._leases.renew(lease, generation, deadline)
                    continue
                if isinstance(failed.error, AlreadyExistsError) and failed.retried:
                    # Granted before a restart whose answer was lost: the job holds the group.
                    held = await self._grant_from_status(lease.group, started, deadline)
                    if held is not None:
                        return held
                raise

    async def _granted_under_live_lease(
        self, lease: Lease, generation: int, deadline: float | None
    ) -> bool:
        """Whether the lease an Acquire was answered under still lives. Past its local
        deadline (no renewal answered for a ttl) only a KeepAlive can tell."""
        assert self._leases is not None
        if lease.generation != generation:
            return False  # registered again while the Acquire was out: that lease is gone
        if not lease.lapsed(asyncio.get_running_loop().time()):
            return True  # the scheduler's deadline is later still
        return await self._leases.alive(lease, deadline)

    async def _grant_from_status(
        self, group: str, started: float, deadline: float | None
    ) -> Grant | None:
        assert self._conn is not None
        status = await self._conn.call(
            "GetGroup", pb.GetGroupRequest(group=group), pb.GroupStatus, deadline=deadline
        )
        if status.holder != self.job:
            return None
        waited = asyncio.get_running_loop().time() - started
        return Grant(status.epoch, waited, False, 0.0, 0, group, self.job)

    async def _yield(self, group_id: str, deadline: float | None) -> YieldResult:
        assert self._conn is not None
        lease = self._lease_of(group_id)
        self._held.pop(group_id, None)  # kept only until the lock is given up
        if lease is None:
            raise FailedPreconditionError(
                f"group: job {self.job!r} does not hold {group_id!r} (it never acquired it)"
            )
        request = pb.YieldRequest(
            job=self.job, group=group_id, lease_id=lease.lease_id, secret=lease.secret
        )
        try:
            retry = None if deadline is None else math.inf
            answer = await self._conn.call(
                "Yield", request, pb.YieldResponse, deadline=deadline, retry_seconds=retry
            )
        except RpcFailed as failed:
            if isinstance(failed.error, FailedPreconditionError) and failed.retried:
                # The first attempt landed before the scheduler went away: already yielded.
                log.info("yield of group %r landed before a scheduler restart", group_id)
                return YieldResult(0, False)
            raise failed.error from None
        return YieldResult(answer.waiters, answer.snapshot_deferred)


def _grant(answer: pb.Grant, group: str, job: str) -> Grant:
    return Grant(
        epoch=answer.epoch,
        waited_seconds=answer.waited_seconds,
        restored=answer.restored,
        switch_seconds=answer.switch_seconds,
        moved_bytes=answer.moved_bytes,
        group=answer.group or group,
        job=answer.job or job,
    )
