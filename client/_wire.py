"""The client's calls to the scheduler: the one client module that builds protobuf and names
RPC methods. Each call returns a domain value (`Grant`, `YieldResult`, `LeaseTerms`...)
and raises the typed rlslice errors the connection translates (`client._connection`).

An attempt whose answer a scheduler restart lost may have done what was asked; the calls
that can tell say so here: a Register refused ALREADY_EXISTS waits for the orphaned lease
to lapse, an Acquire refused ALREADY_EXISTS reads the grant back from GetGroup, and a Yield
refused FAILED_PRECONDITION had landed.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass
from typing import Protocol

from rlslice._errors import AlreadyExistsError, FailedPreconditionError
from rlslice.client._backoff import Backoff
from rlslice.client._connection import Landed, SchedulerConnection
from rlslice.client._results import Grant, YieldResult
from rlslice.client._settings import ClientSettings
from rlslice.config import DEFAULT_LEASE_SECONDS
from rlslice.v1alpha1 import scheduler_pb2 as pb

log = logging.getLogger("rlslice.client")


class Credentials(Protocol):
    """A lease as the wire needs it (`client._leases.Lease` is one)."""

    @property
    def group(self) -> str: ...
    @property
    def lease_id(self) -> str: ...
    @property
    def secret(self) -> str: ...


@dataclass(frozen=True)
class LeaseTerms:
    """A Register's answer: the lease, its ttl, and the scheduler's word on the job."""

    lease_id: str
    secret: str
    lease_seconds: float
    warning: str = ""


@dataclass(frozen=True)
class Renewal:
    """A KeepAlive's answer: the lease's ttl, and whether the scheduler asks for a yield."""

    ttl_seconds: float
    yield_requested: bool
    preempt_in_seconds: float
    yield_reason: str
    """Why it asks: "max_hold", "preempted", "train_waiting" ("unspecified" when not)."""


@dataclass(frozen=True)
class GroupReadout:
    """What the client reads of a group's status."""

    holder: str
    epoch: int
    queue: tuple[str, ...]
    parked: tuple[str, ...]
    faulted: frozenset[str]
    lock_only: frozenset[str]
    discarded: tuple[str, ...] = ()
    """The holder's `discarded_parts`: the tags its grant told (to read a lost grant back)."""


class SchedulerWire:
    """The scheduler's calls for one client (its job, its settings, its session)."""

    def __init__(
        self, connection: SchedulerConnection, settings: ClientSettings, session: str
    ) -> None:
        self._conn = connection
        self._settings = settings
        self._session = session

    async def close(self) -> None:
        """Close the channel for good; calls in flight are cancelled, later ones refused."""
        await self._conn.close()

    async def register(self, group: str, deadline: float | None) -> LeaseTerms:
        """Register the job in `group`, retried through an outage until `deadline`."""
        s = self._settings
        request = pb.RegisterRequest(
            job=s.job,
            group=group,
            lease_seconds=s.lease_seconds,
            device_bytes=s.device_bytes,
            session=self._session,
        )
        if s.priority is not None:
            request.priority = s.priority
        if s.weight is not None:
            request.weight = s.weight
        loop = asyncio.get_running_loop()
        # A Register whose answer a restart lost left a lease we hold no secret for: wait
        # for it to lapse rather than fail (a fresh client gets ALREADY_EXISTS at once).
        orphan_gone = loop.time() + (s.lease_seconds or DEFAULT_LEASE_SECONDS) + 1.0
        delays = Backoff(initial=0.2, cap=2.0).delays()
        orphaned = False
        while True:
            try:
                answer = await self._conn.call_landing(
                    "Register",
                    request,
                    pb.RegisterResponse,
                    deadline=deadline,
                    retry_seconds=math.inf,
                    what="register",
                    landed=(AlreadyExistsError,),
                )
            except AlreadyExistsError:
                if not orphaned or loop.time() > orphan_gone:
                    raise
            else:
                if not isinstance(answer, Landed):
                    break
                orphaned = True
                if loop.time() > orphan_gone:
                    raise answer.error
            log.warning("job %r: waiting for an orphaned lease in %r to lapse", s.job, group)
            await asyncio.sleep(next(delays))
        log.debug(
            "job %r registered in group %r (lease %.1f s)", s.job, group, answer.lease_seconds
        )
        if answer.warning:  # the scheduler's word on this job, e.g. that it is lock only
            log.warning("scheduler: %s", answer.warning)
        return LeaseTerms(answer.lease_id, answer.secret, answer.lease_seconds, answer.warning)

    async def keep_alive(self, lease: Credentials, deadline: float | None) -> Renewal:
        """One KeepAlive of `lease`, retried through an outage until `deadline`."""
        request = pb.KeepAliveRequest(lease_id=lease.lease_id, secret=lease.secret)
        answer = await self._conn.call(
            "KeepAlive", request, pb.KeepAliveResponse, deadline=deadline, retry_seconds=math.inf
        )
        return Renewal(
            answer.ttl_seconds,
            answer.yield_requested,
            answer.preempt_in_seconds,
            pb.YieldReason.Name(answer.yield_reason).removeprefix("YIELD_REASON_").lower(),
        )

    async def unregister(self, lease_id: str, secret: str, deadline: float) -> None:
        """End a lease (giving up its lock, leaving its queue), retried until `deadline`."""
        request = pb.UnregisterRequest(lease_id=lease_id, secret=secret)
        await self._conn.call(
            "Unregister",
            request,
            pb.UnregisterResponse,
            deadline=deadline,
            retry_seconds=math.inf,
        )

    async def acquire(
        self, lease: Credentials, phase: str, deadline: float | None, started: float
    ) -> Grant:
        """Wait for the grant of `lease`'s group, retried through an outage until `deadline`.

        One granted before a restart whose answer was lost is read back from GetGroup;
        `started` (loop time) is when the caller began waiting."""
        job = self._settings.job
        request = pb.AcquireRequest(
            job=job,
            group=lease.group,
            lease_id=lease.lease_id,
            secret=lease.secret,
            phase=phase,
        )
        answer = await self._conn.call_landing(
            "Acquire",
            request,
            pb.Grant,
            deadline=deadline,
            retry_seconds=math.inf,
            landed=(AlreadyExistsError,),
        )
        if isinstance(answer, Landed):
            # Granted before a restart whose answer was lost: the job holds the group, and
            # its status keeps what that grant told of the discarded parts.
            status = await self.group(lease.group, deadline)
            if status.holder != job:
                raise answer.error
            waited = asyncio.get_running_loop().time() - started
            return Grant(
                status.epoch,
                waited,
                False,
                0.0,
                0,
                lease.group,
                job,
                discarded=status.discarded,
            )
        return Grant(
            epoch=answer.epoch,
            waited_seconds=answer.waited_seconds,
            restored=answer.restored,
            switch_seconds=answer.switch_seconds,
            moved_bytes=answer.moved_bytes,
            group=answer.group or lease.group,
            job=answer.job or job,
            discarded=tuple(answer.discarded),
        )

    async def yield_(
        self, lease: Credentials, deadline: float | None, *, retry_seconds: float | None
    ) -> YieldResult:
        """Give `lease`'s group up; one that landed before a restart counts as given up."""
        request = pb.YieldRequest(
            job=self._settings.job,
            group=lease.group,
            lease_id=lease.lease_id,
            secret=lease.secret,
        )
        answer = await self._conn.call_landing(
            "Yield",
            request,
            pb.YieldResponse,
            deadline=deadline,
            retry_seconds=retry_seconds,
            landed=(FailedPreconditionError,),
        )
        if isinstance(answer, Landed):
            log.info("yield of group %r landed before a scheduler restart", lease.group)
            return YieldResult(0, False)
        return YieldResult(answer.waiters, answer.snapshot_deferred)

    async def group(self, group: str, deadline: float | None) -> GroupReadout:
        """The status of `group` (GetGroup), retried within the connection's budget."""
        status = await self._conn.call(
            "GetGroup", pb.GetGroupRequest(group=group), pb.GroupStatus, deadline=deadline
        )
        return GroupReadout(
            holder=status.holder,
            epoch=status.epoch,
            queue=tuple(status.queue),
            parked=tuple(status.parked),
            faulted=frozenset(j.job for j in status.jobs if j.state == pb.JOB_STATE_FAULTED),
            lock_only=frozenset(j.job for j in status.jobs if j.lock_only),
            discarded=next(
                (tuple(j.discarded_parts) for j in status.jobs if j.job == status.holder), ()
            ),
        )
