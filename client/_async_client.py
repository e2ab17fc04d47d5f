"""`AsyncClient`: the one implementation of the job-side API (the sync `Client` wraps it).

The class is in parts: its fields, its wiring and helpers (`_client_core`) and its phases'
shared holds (`_phase_holds`); here are its public calls, its construction and its close.
What it holds is in `_holds`, its calls to the scheduler in `_lock_calls` and `_wire`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections.abc import Iterable
from types import TracebackType
from typing import overload

from rlslice._errors import DeadlineExceededError, FailedPreconditionError, RlsliceError
from rlslice._ids import validate_seconds
from rlslice.adapters.tracing import ACQUIRE, span
from rlslice.client._client_core import Wired, connect
from rlslice.client._leases import Lease, YieldRequestedCallback
from rlslice.client._phase import (
    AsyncGroupsPhase,
    AsyncPhase,
    canonical_groups,
    lock_lost,
    validate_phase,
)
from rlslice.client._phase_holds import PhaseHoldsMixin
from rlslice.client._results import Grant, YieldResult
from rlslice.client._settings import ClientSettings, resolve_settings
from rlslice.config import TLSConfig

log = logging.getLogger("rlslice.client")

#: Longest acquire timeout accepted (a year).
MAX_TIMEOUT = 365 * 86_400.0


class AsyncClient(PhaseHoldsMixin):
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
        self._wired, self._holds = connect(self._settings, on_yield_requested)
        self._agent_registered = False
        self._agent_lock = asyncio.Lock()
        self._closed = False

    # -- what the client is -------------------------------------------------------------

    @property
    def group(self) -> str | None:
        """The default group, used by calls that name none."""
        return self._settings.group

    @property
    def scheduler(self) -> str | None:
        """The scheduler's address, or None for a disabled client."""
        return self._settings.scheduler

    @property
    def closed(self) -> bool:
        """True once `close()` ends the leases (after bringing state home, when asked to),
        or after `mark_closed()`: every later call raises FailedPreconditionError."""
        return self._closed

    def mark_closed(self) -> None:
        """Close a client that never made a call: it holds no lease and no channel, so
        there is nothing to give back (`Client.close` before any call)."""
        self._closed = True

    @property
    def disabled(self) -> bool:
        """True when no scheduler is configured and every call passes through."""
        return self._wired is None

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
        wired = self._wired
        if wired is None:
            return Grant(0, 0.0, False, 0.0, 0, group_id, self.job, disabled=True)
        if self._holds.coming_home(group_id):
            await self._holds.settle(group_id)  # this acquire brings the state home
        await wired.give_backs.settle(group_id)  # a grant an earlier acquire left unread
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = None if timeout is None else started + timeout
        async with span(ACQUIRE, group=group_id, job=self.job, phase=phase or None) as traced:
            lease: Lease | None = None
            try:
                await self._start(group_id)
                lease = await wired.leases.get(group_id, deadline)
                grant = await self._acquire_or_give_back(wired, lease, phase, deadline, started)
            except RlsliceError as error:
                if self._closed:  # close() cut the call: say so, whatever the channel said
                    raise FailedPreconditionError("client: closed") from None
                if lease is not None and isinstance(error, DeadlineExceededError):
                    # (A Register's own deadline error says what it found: left as it is.)
                    raise DeadlineExceededError(
                        f"timeout: group {group_id!r} not granted within {timeout:g} s"
                    ) from None
                raise
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
            self._holds.granted(group_id, grant)
            lease.clear_yield_request()  # any earlier request was about an earlier hold
            return grant

    async def _acquire_or_give_back(
        self, wired: Wired, lease: Lease, phase: str, deadline: float | None, started: float
    ) -> Grant:
        """The Acquire; when the caller cancels or the timeout passes, the grant may have
        been decided all the same (its answer on the way): give it back before propagating
        (see `client._give_back`), so the job neither holds the group unawares nor is
        refused its next acquire."""
        give_backs = wired.give_backs
        give_backs.started(lease.group)
        try:
            grant = await wired.lock_calls.acquire(lease, phase, deadline, started)
        except (asyncio.CancelledError, DeadlineExceededError):
            give_backs.ended(lease.group)
            if not self._closed:  # close() unregisters, which gives everything back
                await give_backs.give_back(lease)
            raise
        except BaseException:
            give_backs.ended(lease.group)
            raise
        give_backs.ended(lease.group)
        return grant

    async def yield_(self, group: str | None = None) -> YieldResult:
        """Give `group` up. Returns at once; only the holder may yield.

        A job that does not hold the group gets FailedPreconditionError.
        """
        group_id = self._group(group)
        self._check_open()
        wired = self._wired
        if wired is None:
            return YieldResult(0, False, disabled=True)
        hold = self._holds.of(group_id)
        if hold.held and self._holds.lost(hold):
            await self._holds.end_lost(group_id)
            raise lock_lost(
                self.job, group_id, hold.grant, "its lease lapsed and was registered again"
            )
        return await self._yield(wired, group_id, None)

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
        """Give up every lock, leave every queue, stop the keep-alives, close the channel.

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
        await self._holds.close()
        if bring_home:
            validate_seconds(
                timeout, "timeout", minimum=1e-3, maximum=MAX_TIMEOUT, allow_zero=False
            )
            await self._bring_home(timeout)
        self._closed = True
        if self._wired is not None:
            await self._wired.leases.close()
            await self._wired.wire.close()

    async def _bring_home(self, timeout: float) -> None:
        """Acquire each group where the scheduler has this job's state parked (or faulted)."""
        if self._wired is None:
            return
        for group in self._wired.leases.groups():
            try:
                deadline = asyncio.get_running_loop().time() + min(timeout, 10.0)
                status = await self._wired.wire.group(group, deadline)
                away = self.job in status.parked or self.job in status.faulted
                # A lock-only job has nothing parked anywhere: nothing to bring home.
                if status.holder == self.job or not away or self.job in status.lock_only:
                    continue
                await self.acquire(timeout=timeout, group=group, phase="close")
            except RlsliceError as error:
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
