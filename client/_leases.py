"""A client's leases, one per group: registered on first use, kept alive in the background.

The keep-alive of a lease runs every third of its ttl; it carries the scheduler's
`yield_requested` back to the job. A lease the scheduler no longer knows (it lapsed, or a
scheduler with an in-memory store restarted) is registered again; a lock held under the
old lease is gone, which `generation` lets a hold notice: the keep-alive tells its listeners
(`subscribe`) that it registered a group again. `expires_at` is the client's own
conservative view of the lease deadline: a phase that finds it passed while the scheduler
cannot be reached knows its lock may be lost (the scheduler fences the job then).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from rlslice._errors import (
    FailedPreconditionError,
    NotFoundError,
    PermissionDeniedError,
    RlsliceError,
)
from rlslice.client._settings import ClientSettings
from rlslice.client._wire import LeaseTerms, Renewal, SchedulerWire

log = logging.getLogger("rlslice.client")

#: Errors with which a scheduler refuses a lease it does not know (lapsed or forgotten).
LEASE_UNKNOWN: tuple[type[RlsliceError], ...] = (NotFoundError, PermissionDeniedError)
#: Shortest pause between keep-alives, whatever the ttl.
MIN_KEEPALIVE_INTERVAL = 0.05
#: Seconds a closing client waits for each Unregister at least; it waits up to the lease's
#: ttl when the scheduler is unreachable (see `Leases._unregister`).
UNREGISTER_TIMEOUT = 5.0

YieldRequestedCallback = Callable[[str, float], object]
"""`on_yield_requested(group, preempt_in_seconds)`; may be a coroutine function."""
RegisteredAgain = Callable[[str], None]
"""`listener(group)`: the keep-alive registered the group again (the old lease lapsed)."""


@dataclass
class Lease:
    """One registration in one group. Mutated only on the client's event loop."""

    group: str
    lease_id: str
    secret: str
    ttl: float
    generation: int = 1
    """Raised at every registration again; a grant from an older generation is void."""
    yield_requested: bool = False
    preempt_in_seconds: float = 0.0
    """Seconds before preemption when asked to yield; infinite for an early yield."""
    yield_reason: str = ""
    """Why the scheduler asks ("max_hold", "preempted", "train_waiting"); "" when not."""
    yield_event: asyncio.Event = field(default_factory=asyncio.Event)
    """Set while `yield_requested` (what `phase.wait_should_yield()` awaits)."""
    task: asyncio.Task[None] | None = None
    registering: asyncio.Future[LeaseTerms] | None = None
    """The keep-alive's Register again while it is in flight. It outlives a cancelled
    keep-alive: a job leaving then unregisters the lease it made (see `_release_lapsed`)."""
    expires_at: float = math.inf
    """Loop time by which the scheduler lapses the lease unless a renewal reaches it: the
    send time of the last answered Register or KeepAlive plus the ttl it answered. Never
    later than the scheduler's own deadline (it started counting on receipt)."""

    def lapsed(self, now: float) -> bool:
        """Whether the scheduler may have lapsed the lease by `now` (no renewal answered)."""
        return now >= self.expires_at

    def note_yield_request(self, asked: bool, preempt_in: float, reason: str) -> None:
        """Keep the scheduler's latest word on yielding (a KeepAlive answer)."""
        self.yield_requested = asked
        self.preempt_in_seconds = preempt_in if asked else 0.0
        self.yield_reason = reason if asked else ""
        if asked:
            self.yield_event.set()
        else:
            self.yield_event.clear()

    def clear_yield_request(self) -> None:
        """Forget a request: it was about a hold that ended (a new grant, a new lease)."""
        self.note_yield_request(False, 0.0, "")


class Leases:
    """Registers, renews and closes the leases of one client."""

    def __init__(
        self,
        wire: SchedulerWire,
        settings: ClientSettings,
        on_yield_requested: YieldRequestedCallback | None,
    ) -> None:
        self._wire = wire
        self._settings = settings
        self._on_yield_requested = on_yield_requested
        self._listeners: list[RegisteredAgain] = []
        self._leases: dict[str, Lease] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._callbacks: set[asyncio.Task[None]] = set()
        self._closing = False

    def subscribe(self, listener: RegisteredAgain) -> None:
        """Have `listener(group)` called each time the keep-alive registers a group again."""
        self._listeners.append(listener)

    def peek(self, group: str) -> Lease | None:
        """The lease in `group`, if the client registered there."""
        return self._leases.get(group)

    def groups(self) -> tuple[str, ...]:
        """The groups the client holds a lease in."""
        return tuple(self._leases)

    async def get(self, group: str, deadline: float | None) -> Lease:
        """The lease in `group`, registering on first use."""
        lease = self._leases.get(group)
        if lease is not None:
            return lease
        async with self._locks.setdefault(group, asyncio.Lock()):
            lease = self._leases.get(group)
            if lease is None:
                sent = asyncio.get_running_loop().time()
                answer = await self._wire.register(group, deadline)
                lease = Lease(group, answer.lease_id, answer.secret, answer.lease_seconds)
                lease.expires_at = sent + answer.lease_seconds
                if self._closing:  # closed while registering: give the lease straight back
                    await self._unregister(lease)
                    raise FailedPreconditionError("client: closed")
                lease.task = asyncio.create_task(
                    self._keep_alive(lease), name=f"rlslice-keepalive-{group}"
                )
                self._leases[group] = lease
            return lease

    async def renew(self, lease: Lease, seen_generation: int, deadline: float | None) -> None:
        """Register `lease`'s group again, unless that happened since `seen_generation`."""
        async with self._locks.setdefault(lease.group, asyncio.Lock()):
            if lease.generation != seen_generation:
                return
            if self._closing:
                raise FailedPreconditionError("client: closed")
            sent = asyncio.get_running_loop().time()
            call = asyncio.ensure_future(self._wire.register(lease.group, deadline))
            lease.registering = call
            call.add_done_callback(lambda _: _forget_registering(lease, call))
            # Shielded: a keep-alive cancelled while the scheduler registers must not lose
            # the answer, or the new lease would live on with no one holding its secret.
            answer = await asyncio.shield(call)
            lease.lease_id, lease.secret = answer.lease_id, answer.secret
            lease.ttl = answer.lease_seconds
            lease.expires_at = sent + answer.lease_seconds
            lease.generation += 1
            lease.clear_yield_request()
            log.warning(
                "lease of job %r in group %r was unknown to the scheduler: registered again "
                "(a lock held under the old lease is lost)",
                self._settings.job,
                lease.group,
            )

    async def alive(self, lease: Lease, deadline: float | None) -> bool:
        """Ask the scheduler whether `lease` lives (a KeepAlive, retried through an outage
        until `deadline`); True renews it. False when the scheduler does not know it."""
        generation = lease.generation
        try:
            await self._renewal(lease, deadline)
        except LEASE_UNKNOWN:
            return False
        return lease.generation == generation

    async def _renewal(self, lease: Lease, deadline: float | None) -> Renewal:
        """One KeepAlive of `lease`, retried through an outage until `deadline`. Its answer
        moves the local deadline on, unless the lease was registered again meanwhile."""
        generation = lease.generation
        sent = asyncio.get_running_loop().time()
        answer = await self._wire.keep_alive(lease, deadline)
        if lease.generation == generation:
            lease.expires_at = sent + answer.ttl_seconds
        return answer

    async def _keep_alive(self, lease: Lease) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(max(MIN_KEEPALIVE_INTERVAL, lease.ttl / 3))
            generation = lease.generation
            try:
                # Retry through a restart for up to one ttl; the next tick tries again.
                answer = await self._renewal(lease, loop.time() + max(1.0, lease.ttl))
            except LEASE_UNKNOWN:
                await self._renew_quietly(lease, generation)
                continue
            except RlsliceError as error:
                log.warning("keep-alive of group %r failed: %s", lease.group, error)
                continue
            if answer.ttl_seconds > 0:
                lease.ttl = answer.ttl_seconds
            self._note_yield_request(lease, answer)

    async def _renew_quietly(self, lease: Lease, generation: int) -> None:
        if self._closing:
            return  # unregistered a moment ago: nothing to renew
        try:
            await self.renew(lease, generation, None)
        except Exception as error:  # the keep-alive must outlive any one failure
            log.warning("registering again in group %r failed: %s", lease.group, error)
            return
        if lease.generation != generation:
            for listener in self._listeners:
                listener(lease.group)

    def _note_yield_request(self, lease: Lease, answer: Renewal) -> None:
        asked_now = answer.yield_requested and not lease.yield_requested
        lease.note_yield_request(
            answer.yield_requested, answer.preempt_in_seconds, answer.yield_reason
        )
        if not asked_now:
            return
        log.info(
            "scheduler asks job %r to yield group %r (%s; preemption in %.1f s)",
            self._settings.job,
            lease.group,
            answer.yield_reason,
            answer.preempt_in_seconds,
        )
        if self._on_yield_requested is not None:
            # In a task of its own: a slow callback must not hold up the keep-alive.
            task = asyncio.create_task(
                self._call_back(self._on_yield_requested, lease.group, answer.preempt_in_seconds)
            )
            self._callbacks.add(task)
            task.add_done_callback(self._callbacks.discard)

    @staticmethod
    async def _call_back(callback: YieldRequestedCallback, group: str, preempt_in: float) -> None:
        try:
            result = callback(group, preempt_in)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("on_yield_requested callback failed for group %r", group)

    async def close(self) -> None:
        """Unregister every lease (giving up locks, leaving queues), then stop the keep-alives.

        The keep-alives run until the Unregister calls are answered: a busy scheduler must
        not see a lease lapse first (a lapse releases the job's state without force, which
        leaves a parked job's processes frozen), as the soak showed under load."""
        self._closing = True
        leases, self._leases = list(self._leases.values()), {}
        for task in list(self._callbacks):
            task.cancel()
        try:
            await asyncio.gather(*(self._unregister(lease) for lease in leases))
        finally:
            for lease in leases:
                if lease.task is not None:
                    lease.task.cancel()
            for lease in leases:
                if lease.task is not None:
                    await asyncio.gather(lease.task, return_exceptions=True)

    async def _unregister(self, lease: Lease) -> None:
        loop = asyncio.get_running_loop()
        sent = lease.lease_id
        try:
            # A restarting scheduler keeps every lease for a ttl after loading; an
            # Unregister that gives up sooner lets the lease lapse, which releases
            # without force and leaves a parked job's processes frozen (the soak saw it).
            await self._wire.unregister(
                lease.lease_id, lease.secret, loop.time() + max(UNREGISTER_TIMEOUT, lease.ttl)
            )
        except LEASE_UNKNOWN:
            await self._release_lapsed(lease, sent)
        except RlsliceError as error:
            log.warning("unregistering from group %r failed: %s", lease.group, error)

    async def _release_lapsed(self, lease: Lease, sent: str) -> None:
        """The lease `sent` lapsed before the job left (a partition, a stall). A lapse
        releases the job's state without force and a fence parks it, so its processes may
        sit frozen on its nodes: unregister the lease the keep-alive registered since, or
        register once more and unregister, which releases with force (the agents resume
        them), so a job that leaves is never left parked."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(UNREGISTER_TIMEOUT, lease.ttl)
        if lease.task is not None:
            # Leaving: its keep-alive stops now rather than after this, so nothing registers
            # behind our back; a Register of its already in flight goes on (shielded), and
            # the lease it makes is the one to unregister.
            lease.task.cancel()
            await asyncio.gather(lease.task, return_exceptions=True)
        pending = lease.registering
        try:
            if pending is not None:  # the keep-alive was registering again: await its lease
                left = max(0.0, deadline - loop.time())
                answer = await asyncio.wait_for(asyncio.shield(pending), left)
                lease_id, secret = answer.lease_id, answer.secret
            elif lease.lease_id != sent:  # the keep-alive registered again meanwhile
                lease_id, secret = lease.lease_id, lease.secret
            else:
                answer = await self._wire.register(lease.group, deadline)
                lease_id, secret = answer.lease_id, answer.secret
            await self._wire.unregister(lease_id, secret, deadline)
        except Exception as error:  # leaving anyway: say why the state may stay parked
            log.warning(
                "job %r left group %r after its lease lapsed; releasing its state failed: %s",
                self._settings.job,
                lease.group,
                error,
            )
        finally:
            if pending is not None and not pending.done():
                pending.cancel()  # it retries with no deadline: it must not land later


def _forget_registering(lease: Lease, call: asyncio.Future[LeaseTerms]) -> None:
    if lease.registering is call:
        lease.registering = None
    if not call.cancelled():
        call.exception()  # retrieved: its awaiter may have been cancelled (see `renew`)
