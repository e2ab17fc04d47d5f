"""`AsyncClient`: the one implementation of the job-side API (the sync `Client` wraps it)."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import TracebackType
from typing import overload

from rlslice._errors import (
    AlreadyExistsError,
    DeadlineExceededError,
    FailedPreconditionError,
    NotFoundError,
    PermissionDeniedError,
    RlsliceError,
    UnavailableError,
)
from rlslice._ids import validate_seconds
from rlslice.adapters.tracing import ACQUIRE, span
from rlslice.client._agent import register_with_local_agent
from rlslice.client._backoff import Backoff
from rlslice.client._connection import Connection, RpcFailed
from rlslice.client._give_back import GiveBacks
from rlslice.client._homecoming import HOMECOMING_PHASE, Homecomings
from rlslice.client._leases import LEASE_UNKNOWN, Lease, Leases, YieldRequestedCallback
from rlslice.client._phase import (
    LAPSED_YIELD_SECONDS,
    AsyncGroupsPhase,
    AsyncPhase,
    canonical_groups,
    lock_lost,
    validate_phase,
)
from rlslice.client._results import Grant, YieldResult
from rlslice.client._settings import ClientSettings, resolve_settings
from rlslice.config import TLSConfig
from rlslice.v1alpha1 import scheduler_pb2 as pb

log = logging.getLogger("rlslice.client")

#: Seconds a call other than Acquire keeps retrying while the scheduler is unreachable.
RETRY_SECONDS = 30.0
#: Longest acquire timeout accepted (a year).
MAX_TIMEOUT = 365 * 86_400.0


@dataclass
class _Hold:
    """How many phases of this client are inside a group, and the grant they share."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    count: int = 0
    grant: Grant | None = None
    generation: int = 0


@dataclass(frozen=True)
class _Held:
    """A group the job acquired and has not yielded: its grant, and the generation of the
    lease it was granted under (a later generation means the lock was lost)."""

    grant: Grant
    generation: int


class AsyncClient:
    """A job's handle on the scheduler, for asyncio code.

    Arguments left out are read from the environment: `RLSLICE_JOB`, `RLSLICE_GROUP`,
    `RLSLICE_SCHEDULER`, `RLSLICE_TOKEN` (or `RLSLICE_TOKEN_FILE`), `RLSLICE_LEASE_SECONDS`,
    `RLSLICE_TLS_CA` / `RLSLICE_TLS_CERT` / `RLSLICE_TLS_KEY`. With no scheduler configured
    the client is disabled: every call passes through at once, so the same code runs alone.

    `device_bytes` (the device memory the job expects to hold) helps the scheduler decide
    whether jobs fit side by side; `on_yield_requested(group, preempt_in_seconds)` is called
    when the scheduler asks the job to yield a group it held too long.

    Ids are checked here (InvalidArgumentError naming the field); nothing touches the network
    until the first call, which registers the job in the group (one lease per group, kept
    alive in the background until `close()`).
    """

    def __init__(
        self,
        job: str | None = None,
        group: str | None = None,
        scheduler: str | None = None,
        lease_seconds: float | None = None,
        token: str | None = None,
        tls: TLSConfig | None = None,
        priority: int | None = None,
        weight: float | None = None,
        *,
        device_bytes: int | None = None,
        on_yield_requested: YieldRequestedCallback | None = None,
    ) -> None:
        self._settings: ClientSettings = resolve_settings(
            job=job,
            group=group,
            scheduler=scheduler,
            lease_seconds=lease_seconds,
            token=token,
            tls=tls,
            priority=priority,
            weight=weight,
            env=os.environ,
            device_bytes=device_bytes,
        )
        self._conn: Connection | None = None
        self._leases: Leases | None = None
        self._give_backs: GiveBacks | None = None
        if self._settings.scheduler is None:
            log.info(
                "no scheduler configured (scheduler= or RLSLICE_SCHEDULER): client disabled, every call passes through"
            )
        else:
            self._conn = Connection(
                self._settings.scheduler,
                tls=self._settings.tls,
                token=self._settings.token,
                backoff=Backoff(),
                retry_seconds=RETRY_SECONDS,
            )
            # One session per client object: its waits and holds are one thread of control
            # for the scheduler's deadlock check, apart from other processes of the job.
            self._leases = Leases(
                self._conn,
                self._settings,
                on_yield_requested,
                session=secrets.token_hex(8),
                on_renewed=self._lease_renewed,
            )
            self._give_backs = GiveBacks(self._conn, self.job, lambda group: group in self._held)
        self._holds: dict[str, _Hold] = {}
        self._held: dict[str, _Held] = {}
        self._homecomings = Homecomings(self._acquire_home, self._yield)
        self._agent_registered = False
        self._agent_lock = asyncio.Lock()
        self._closed = False

    # -- what the client is -------------------------------------------------------------

    @property
    def job(self) -> str:
        """The job id ("" for a disabled client given none)."""
        return self._settings.job

    @property
    def group(self) -> str | None:
        """The default group, used by calls that name none."""
        return self._settings.group

    @property
    def scheduler(self) -> str | None:
        """The scheduler's address, or None for a disabled client."""
        return self._settings.scheduler

    @property
    def disabled(self) -> bool:
        """True when no scheduler is configured and every call passes through."""
        return self._settings.scheduler is None

    def yield_requested(self, group: str | None = None) -> bool:
        """Whether the scheduler asks this job to yield `group`: it held past
        max_hold_seconds, or (early yield) it runs a `rollout` while a `train` waits."""
        lease = self._lease_of(self._group(group))
        return lease is not None and lease.yield_requested

    async def wait_yield_requested(
        self, group: str | None = None, timeout: float | None = None
    ) -> bool:
        """Wait until the scheduler asks this job to yield `group`; False after `timeout`."""
        lease = self._lease_of(self._group(group))
        if lease is None:  # not registered there (or a disabled client): never asked
            await asyncio.sleep(math.inf if timeout is None else timeout)
            return False
        try:
            await asyncio.wait_for(lease.yield_event.wait(), timeout)
        except TimeoutError:
            return False
        return True

    # -- the calls ------------------------------------------------------------------------

    async def acquire(
        self, timeout: float | None = None, group: str | None = None, phase: str = ""
    ) -> Grant:
        """Block until the job holds `group` (the default group when None).

        `timeout` in seconds raises DeadlineExceededError when it passes; cancelling the
        awaiting task cancels the call. Either way the job leaves the group's queue at once,
        and a grant decided as it left is given back before the error propagates.
        A scheduler restart while waiting does not surface: the call is issued again.
        """
        group_id = self._group(group)
        if timeout is not None:
            validate_seconds(
                timeout, "timeout", minimum=1e-3, maximum=MAX_TIMEOUT, allow_zero=False
            )
        if phase:
            validate_phase(phase)
        self._check_open()
        if self._leases is None or self._conn is None or self._give_backs is None:
            return Grant(0, 0.0, False, 0.0, 0, group_id, self.job, disabled=True)
        if self._homecomings.outstanding(group_id):
            await self._homecomings.settle(group_id)  # this acquire brings the state home
        await self._give_backs.settle(group_id)  # a grant an earlier acquire left unread
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = None if timeout is None else started + timeout
        async with span(ACQUIRE, group=group_id, job=self.job, phase=phase or None) as traced:
            try:
                await self._start(group_id)
                lease = await self._leases.get(group_id, deadline)
                grant = await self._acquire_or_give_back(lease, phase, deadline, started)
            except RpcFailed as failed:
                if self._closed:  # close() cut the call: say so, whatever the channel said
                    raise FailedPreconditionError("client: closed") from None
                if isinstance(failed.error, DeadlineExceededError):
                    raise DeadlineExceededError(
                        f"timeout: group {group_id!r} not granted within {timeout:g} s"
                    ) from None
                raise failed.error from None
            except asyncio.CancelledError:
                # Closing the channel cancels calls under it; only a cancellation of this
                # task itself is the caller's own and propagates as one.
                task = asyncio.current_task()
                if self._closed and task is not None and not task.cancelling():
                    raise FailedPreconditionError("client: closed") from None
                raise
            traced.set(
                epoch=grant.epoch,
                waited_seconds=grant.waited_seconds,
                switch_seconds=grant.switch_seconds,
                moved_bytes=grant.moved_bytes,
                restored=grant.restored,
            )
            self._held[group_id] = _Held(grant, lease.generation)
            lease.clear_yield_request()  # any earlier request was about an earlier hold
            return grant

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

    async def yield_(self, group: str | None = None) -> YieldResult:
        """Give `group` up. Returns at once; only the holder may yield.

        A job that does not hold the group gets FailedPreconditionError.
        """
        group_id = self._group(group)
        self._check_open()
        if self._conn is None:
            return YieldResult(0, False, disabled=True)
        held = self._held.get(group_id)
        if held is not None and self._lost(group_id, held.generation):
            await self._end_lost_hold(group_id)
            raise lock_lost(
                self.job, group_id, held.grant, "its lease lapsed and was registered again"
            )
        return await self._yield(group_id, None)

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

    async def release(self, group: str | None = None) -> YieldResult:
        """Alias of `yield_()`."""
        return await self.yield_(group)

    @overload
    def phase(self, name: str, group: str | None = None) -> AsyncPhase: ...

    @overload
    def phase(
        self, name: str, group: None = None, *, groups: Iterable[str]
    ) -> AsyncGroupsPhase: ...

    def phase(
        self, name: str, group: str | None = None, *, groups: Iterable[str] | None = None
    ) -> AsyncPhase | AsyncGroupsPhase:
        """Hold `group` for a block: `async with client.phase("train"):` or as a decorator
        of an async function. Nested and concurrent phases of one client share one hold.

        `groups=[...]` (instead of `group`) holds several groups for the block: they are
        acquired in sorted order whatever order is given, and yielded in reverse, so jobs
        that need the same groups never deadlock. The `as` value is then a
        `dict[str, Grant]` keyed by group. If a later group fails (timeout, ABORTED,
        close, cancellation), the groups already entered are left before the error
        propagates. Ids are checked here; duplicates and `group` with `groups` are refused.
        """
        validate_phase(name)
        if groups is None:
            return AsyncPhase(self, name, self._group(group))
        return AsyncGroupsPhase(self, name, canonical_groups(groups, group))

    async def close(self, *, bring_home: bool = False, timeout: float = 60.0) -> None:
        """Release every lock, leave every queue, stop the keep-alives, close the channel.

        By default the job leaves at once: a parked copy of its state is dropped and its
        processes resumed, which is right for a process about to exit. A process that goes
        on using its GPU state after `close()` (saves the model, evaluates) passes
        `bring_home=True`: in every group where its state is parked it acquires the group
        once more (waiting up to `timeout` seconds for its turn) and leaves while holding,
        so its state is home when `close()` returns and nothing of it is snapshotted on
        the way out. (Not the default: a closing job would wait for the holder's phase.)
        """
        if self._closed:
            return
        await self._homecomings.close()
        if bring_home:
            validate_seconds(
                timeout, "timeout", minimum=1e-3, maximum=MAX_TIMEOUT, allow_zero=False
            )
            await self._bring_home(timeout)
        self._closed = True
        if self._leases is not None:
            await self._leases.close()
        if self._conn is not None:
            await self._conn.close()

    async def _bring_home(self, timeout: float) -> None:
        """Acquire each group where the scheduler has this job's state parked (or faulted)."""
        if self._leases is None or self._conn is None:
            return
        for group in self._leases.groups():
            try:
                status = await self._conn.call(
                    "GetGroup",
                    pb.GetGroupRequest(group=group),
                    pb.GroupStatus,
                    deadline=asyncio.get_running_loop().time() + min(timeout, 10.0),
                )
                mine = next((j for j in status.jobs if j.job == self.job), None)
                # A lock-only job has nothing parked anywhere: nothing to bring home.
                away = self.job in status.parked or (
                    mine is not None and mine.state == pb.JOB_STATE_FAULTED
                )
                if status.holder == self.job or not away or (mine and mine.lock_only):
                    continue
                await self.acquire(timeout=timeout, group=group, phase="close")
            except (RlsliceError, RpcFailed) as error:
                log.warning(
                    "close: job %s could not bring its state home from group %r: %s",
                    self.job,
                    group,
                    error,
                )

    async def __aenter__(self) -> AsyncClient:
        self._check_open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        where = self.scheduler or "disabled"
        return f"<AsyncClient job={self.job!r} group={self.group!r} scheduler={where}>"

    # -- phases -------------------------------------------------------------------------

    async def _enter_phase(self, name: str, group: str) -> Grant:
        hold = self._holds.setdefault(group, _Hold())
        async with hold.lock:
            if hold.count == 0:
                hold.grant = await self.acquire(group=group, phase=name)
                lease = self._lease_of(group)
                hold.generation = lease.generation if lease is not None else 0
            else:
                # A nested phase is the job's next call under the hold: a lost lock says so.
                self._check_hold(group, hold)
            hold.count += 1
            assert hold.grant is not None
            return hold.grant

    async def _exit_phase(self, group: str) -> None:
        hold = self._holds[group]
        async with hold.lock:
            hold.count -= 1
            if hold.count > 0:
                return
            grant, hold.grant = hold.grant, None
            if self._lost(group, hold.generation):
                await self._end_lost_hold(group)
            self._check_hold(group, hold, grant)
            if self._closed or self._conn is None:
                return
            lease = self._lease_of(group)
            loop = asyncio.get_running_loop()
            lapsed = lease is not None and lease.lapsed(loop.time())
            # Past the lease deadline with no renewal answered, a long retry would only hide
            # the loss: try briefly, then report it.
            deadline = loop.time() + LAPSED_YIELD_SECONDS if lapsed else None
            try:
                await self._yield(group, deadline)
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

    def _lost(self, group: str, generation: int) -> bool:
        """Whether the lease of `group` was registered again since `generation`."""
        lease = self._lease_of(group)
        return lease is not None and lease.generation != generation

    async def _end_lost_hold(self, group: str) -> None:
        """Forget a hold whose lock was lost, and end its homecoming (see `Homecomings.settle`)."""
        self._held.pop(group, None)
        await self._homecomings.settle(group)

    def _lease_renewed(self, group: str) -> None:
        """The keep-alive registered `group` again: a lock the job held there is lost, and
        its state may be fenced while its code waits on it; bring it home (see
        `client._homecoming`)."""
        held = self._held.get(group)
        if held is not None and not self._closed and self._lost(group, held.generation):
            self._homecomings.start(group, self.job)

    async def _acquire_home(self, group: str) -> Grant:
        assert self._leases is not None
        lease = await self._leases.get(group, None)
        try:
            grant = await self._acquire(
                lease, HOMECOMING_PHASE, None, asyncio.get_running_loop().time()
            )
        except RpcFailed as failed:
            raise failed.error from None
        return grant

    def _check_hold(self, group: str, hold: _Hold, grant: Grant | None = None) -> None:
        """Raise LockLostError when the lease the hold was granted under is gone."""
        if self._lost(group, hold.generation):
            log.warning("job %r lost group %r during a phase (its lease lapsed)", self.job, group)
            raise lock_lost(
                self.job, group, grant or hold.grant, "its lease lapsed and was registered again"
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

    # -- helpers ------------------------------------------------------------------------

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
