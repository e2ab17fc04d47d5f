"""The engine: drives the pure core for every group, on one asyncio loop.

It owns what the core must not: the clock, asyncio futures for blocked acquires, one timer
per group set at the group's next deadline (never a polling loop), the event ring,
persistence after every accepted event (a grant or switch start committed before it takes
effect), and the coordinator that executes switches. What changes for reasons of its own
lives beside it: the lease index (`_leases.py`), the watch fan-out (`_watch.py`), what
transitions mean for the metrics (`_engine_metrics.py`), executing what a transition
decided (`_execution.py`) and the rule that commits it before its grants and switch starts
take effect (`_durability.py`), which `Engine` inherits. It speaks rlslice
errors, not gRPC: `service.py` translates.

Every public method runs on the loop thread; `_apply` is synchronous, so a transition, its
persistence and its actions happen without interleaving.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import secrets
from dataclasses import dataclass
from typing import Protocol

from rlslice._errors import (
    AbortedError,
    FailedPreconditionError,
    NotFoundError,
    ResourceExhaustedError,
    UnavailableError,
)
from rlslice.config import GroupSpec
from rlslice.scheduler import _engine_metrics as metered
from rlslice.scheduler._durability import _Durability
from rlslice.scheduler._execution import STORE_RETRY_SECONDS
from rlslice.scheduler._leases import LeaseIndex, hash_secret
from rlslice.scheduler._runtime import EventEntry, EventRing, GroupRuntime
from rlslice.scheduler._watch import WatchHub
from rlslice.scheduler.clock import LoopClock
from rlslice.scheduler.core import (
    Deadlock,
    GroupState,
    actions,
    events,
    new_group,
    step,
)
from rlslice.scheduler.core.actions import Kind
from rlslice.scheduler.core.capacity import register_refusal
from rlslice.scheduler.core.registration import AgentSurvey, RegistrationVerdict, judge
from rlslice.scheduler.core.state import JobRecord, Switch
from rlslice.scheduler.core.waits import WaitIndex, actor
from rlslice.scheduler.metrics import SchedulerMetrics
from rlslice.scheduler.store import AgentRecord, Store

log = logging.getLogger(__name__)


class SwitchRunner(Protocol):
    """What the engine needs from the coordinator."""

    def nodes_for(self, spec: GroupSpec) -> tuple[str, ...]:
        """Nodes whose agents take part in the group's switches."""
        ...

    async def run_switch(self, state: GroupState, switch: Switch) -> events.Event:
        """Execute a switch; return SwitchDone, SnapshotFailed, SwitchFailed or RestoreFailed."""
        ...

    async def release(self, spec: GroupSpec, job: str, force: bool) -> None:
        """Ask the group's agents to drop a job's state."""
        ...

    async def survey(self, spec: GroupSpec) -> AgentSurvey:
        """One Status fan-out over the group's nodes: who knows which job, parking room."""
        ...


@dataclass(frozen=True, slots=True)
class Registration:
    """What Register answers."""

    lease_id: str
    secret: str
    lease_seconds: float
    epoch: int
    warning: str = ""
    """Why the job is lock only (no agent of the group knows it), or ""."""


class Engine(_Durability):
    """Every group's state and the machinery around it."""

    def __init__(
        self,
        store: Store,
        runner: SwitchRunner,
        metrics: SchedulerMetrics,
        *,
        auto_create_groups: bool = False,
        max_jobs_per_group: int = 256,
        max_groups: int = 1024,
        host_reserve_bytes: int = 0,
        ring_size: int = 128,
        watch_queue_size: int = 1024,
        clock: LoopClock | None = None,
    ) -> None:
        self.store = store
        self.runner = runner
        self.metrics = metrics
        self.auto_create_groups = auto_create_groups
        self.max_jobs_per_group = max_jobs_per_group
        self.max_groups = max_groups
        """Bounds on what Register may grow (jobs in a group; groups it auto-creates)."""
        self.host_reserve_bytes = host_reserve_bytes
        self.clock = clock if clock is not None else LoopClock()
        """The one clock: state's Unix times and the timers both read the loop's time."""
        self._ring_size = ring_size
        self.groups: dict[str, GroupRuntime] = {}
        self._leases = LeaseIndex()
        self._watch = WatchHub(watch_queue_size)
        self.waits = WaitIndex()
        """Who holds and who waits across groups, for the deadlock check."""
        self._tickets = itertools.count(1)
        self._seq = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.ready = False
        """True once the store is loaded and interrupted switches resumed (`recover`): the
        service answers UNAVAILABLE (clients retry) until then, never from an empty state."""
        metrics.watch_busy(self._busy_fractions)

    # -- life cycle -------------------------------------------------------------------

    async def start(self, initial_groups: tuple[GroupSpec, ...] = ()) -> dict[str, AgentRecord]:
        """Load the store, resume interrupted switches, create the configured groups."""
        self.clock.start()
        loaded = await self.store.load()
        for name, state in loaded.groups.items():
            runtime = GroupRuntime(state, EventRing(self._ring_size))
            self.groups[name] = runtime
            self.waits.update(None, state)
            metered.load_group(self.metrics, state)
            self._leases.add_group(state)
        self.metrics.groups.set(len(self.groups))
        for spec in initial_groups:
            self.put_group(spec)
        return loaded.agents

    def recover(self) -> None:
        """After the coordinator knows its agents: detach old waiters, resume switches.

        A group whose recovery the store refuses (a failing disk, while resuming a switch
        that must be committed) is tried again every STORE_RETRY_SECONDS; until every group
        is recovered, `ready` stays False and calls are answered UNAVAILABLE (clients retry).
        """
        self._recover(list(self.groups.values()))

    def _recover(self, pending: list[GroupRuntime]) -> None:
        refused: list[GroupRuntime] = []
        why: UnavailableError | None = None
        for runtime in pending:
            if self.groups.get(runtime.state.name) is not runtime:
                continue  # deleted meanwhile
            try:
                self._apply(runtime, events.Recover())
            except UnavailableError as error:
                refused.append(runtime)
                why = error
        if not refused:
            self.ready = True
            return
        log.warning(
            "recovery of %s waits for the store (retried every %g s): %s",
            ", ".join(runtime.state.name for runtime in refused),
            STORE_RETRY_SECONDS,
            why,
        )
        if not self._closed:
            asyncio.get_running_loop().call_later(STORE_RETRY_SECONDS, self._recover, refused)

    async def close(self) -> None:
        """Fail open calls, cancel timers and switch tasks, flush the store."""
        self._closed = True
        for runtime in self.groups.values():
            if runtime.timer is not None:
                runtime.timer.cancel()
            for future in runtime.calls.values():
                if not future.done():
                    future.set_exception(UnavailableError("scheduler: shutting down"))
            runtime.calls.clear()
        self._watch.close(self.groups.values())
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.store.flush()

    # -- requests ---------------------------------------------------------------------

    def register(
        self,
        group: str,
        job: str,
        lease_seconds: float,
        priority: int | None,
        weight: float | None,
        device_bytes: int,
        session: str = "",
        *,
        lock_only: bool = False,
    ) -> Registration:
        """Open a lease for `job` in `group` (created first in auto-create mode); no check
        with the agents (`register_job` makes them)."""
        runtime = self.groups.get(group)
        if runtime is None:
            if not self.auto_create_groups:
                raise NotFoundError(f"group: {group!r} does not exist")
            if len(self.groups) >= self.max_groups:
                raise ResourceExhaustedError(
                    f"group {group!r}: not created: the scheduler has {len(self.groups)} "
                    f"groups, its limit (--max-groups {self.max_groups})"
                )
            self.put_group(GroupSpec(name=group))
            runtime = self.groups[group]
        jobs = runtime.state.jobs
        if job not in jobs and len(jobs) >= self.max_jobs_per_group:
            raise ResourceExhaustedError(
                f"group {group!r}: job {job!r} refused: the group has {len(jobs)} jobs, "
                f"its limit (--max-jobs-per-group {self.max_jobs_per_group})"
            )
        seconds = lease_seconds or runtime.state.spec.lease_seconds
        lease_id = secrets.token_hex(12)
        secret = secrets.token_urlsafe(32)
        event = events.Register(
            job,
            lease_id,
            hash_secret(secret),
            seconds,
            priority,
            weight,
            device_bytes,
            session,
            lock_only,
        )
        self._apply(runtime, event)
        self._leases.add(lease_id, group, job)
        return Registration(lease_id, secret, seconds, runtime.state.epoch)

    async def register_job(
        self,
        group: str,
        job: str,
        lease_seconds: float,
        priority: int | None,
        weight: float | None,
        device_bytes: int,
        session: str = "",
    ) -> Registration:
        """Register, as a client's Register asks: one Status fan-out over the group's nodes
        (none without agents: a pure lock), then refuse (RESOURCE_EXHAUSTED) a job whose
        parked state, beside every other job's of the group, would not fit in a node's
        host memory (`core.capacity`), and a job no agent knows where the group requires
        agent registration (FAILED_PRECONDITION); else register it, lock only (warned, and
        kept in its job record) when no agent knows it (`core.registration`)."""
        runtime = self.groups.get(group)
        spec = runtime.state.spec if runtime is not None else GroupSpec(name=group)
        nodes = self.runner.nodes_for(spec)
        verdict: RegistrationVerdict | None = None
        if nodes:
            survey = await self.runner.survey(spec)
            jobs = runtime.state.jobs if runtime is not None else {}
            known = runtime is not None or self.auto_create_groups
            if device_bytes > 0 and known and job not in jobs:
                others = {name: record.device_bytes for name, record in jobs.items()}
                reason = register_refusal(
                    group, job, device_bytes, others, survey.parking, self.host_reserve_bytes
                )
                if reason is not None:
                    raise ResourceExhaustedError(reason)
            verdict = judge(job, group, nodes, survey.jobs)
            if verdict.lock_only and spec.require_agent_registration:
                raise FailedPreconditionError(verdict.message(required=True))
        lock_only = verdict is not None and verdict.lock_only
        done = self.register(
            group, job, lease_seconds, priority, weight, device_bytes, session, lock_only=lock_only
        )
        if verdict is None or not lock_only:
            return done
        warning = verdict.message(required=False)
        self.metrics.count_lock_only(group)
        log.warning("%s", warning)
        return dataclasses.replace(done, warning=warning)

    def lease(self, lease_id: str, secret: str) -> tuple[GroupRuntime, JobRecord]:
        """The live lease `lease_id`, once `secret` proves the caller owns it."""
        return self._leases.find(self.groups, lease_id, secret)

    def job_lease(
        self, group: str, job: str, lease_id: str, secret: str
    ) -> tuple[GroupRuntime, JobRecord]:
        """Like `lease`, and the lease must be `job`'s in `group`."""
        return self._leases.find_job(self.groups, group, job, lease_id, secret)

    def keepalive(self, lease_id: str, secret: str) -> tuple[float, bool, float]:
        """Renew a lease; (ttl, yield requested, seconds before preemption)."""
        from rlslice.scheduler.core import keepalive_answer

        runtime, record = self.lease(lease_id, secret)
        self._apply(runtime, events.KeepAlive(record.name))
        return keepalive_answer(runtime.state, record.name, self.clock())

    def unregister(self, lease_id: str, secret: str) -> None:
        """Close a lease at once."""
        runtime, record = self.lease(lease_id, secret)
        self._apply(runtime, events.Unregister(record.name))

    async def acquire(
        self, group: str, job: str, lease_id: str, secret: str, phase: str
    ) -> actions.GrantAction:
        """Block until `job` holds `group`. A cancelled caller leaves the queue at once."""
        runtime, _ = self.job_lease(group, job, lease_id, secret)
        ticket = next(self._tickets)
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        runtime.calls[ticket] = future
        try:
            self._apply(runtime, events.Acquire(job, ticket, phase))
            if not future.done() and self.waits.waits(actor(runtime.state, job), group):
                # The job queued (or came back to its place): its wait must not close a cycle.
                self._break_cycle(runtime, job, ticket)
        except BaseException:
            runtime.calls.pop(ticket, None)
            raise
        if not future.done():
            try:
                await future
            except asyncio.CancelledError:
                if future.done() and not future.cancelled() and future.exception() is None:
                    # Granted in the instant the caller left: give the lock back.
                    granted = future.result()
                    assert isinstance(granted, actions.GrantAction)
                    self.lost_grant(group, job, granted.epoch)
                else:
                    self._abandon(group, job, ticket)
                raise
        grant = future.result()
        assert isinstance(grant, actions.GrantAction)
        return grant

    def _abandon(self, group: str, job: str, ticket: int) -> None:
        """The caller of acquire `ticket` left: take it out of the queue at once."""
        runtime = self.groups.get(group)
        if runtime is None:
            return
        runtime.calls.pop(ticket, None)
        self._apply(runtime, events.Cancel(job, ticket))

    def _break_cycle(self, runtime: GroupRuntime, job: str, ticket: int) -> bool:
        """Fail acquire `ticket` of `job` (ABORTED) if its wait closes a wait-for cycle
        across groups. The waiter leaves the queue as a cancelled one does; the holders
        keep their groups. True when it failed."""
        cycle: Deadlock | None = self.waits.cycle(actor(runtime.state, job), runtime.state.name)
        if cycle is None:
            return False
        message = cycle.message()
        log.warning("%s", message)
        future = runtime.calls.pop(ticket, None)
        if future is not None and not future.done():
            future.set_exception(AbortedError(message))
        self._record(runtime, actions.Record(Kind.FAILED, job, message))
        self._apply(runtime, events.Cancel(job, ticket))
        return True

    def _check_waiters(self, runtime: GroupRuntime) -> None:
        """The group has a new holder: its waiters now wait on that job. Fail each wait
        that closes a cycle (each failure breaks one; another waiter may close another)."""
        group = runtime.state.name
        for waiter in runtime.state.queue:
            if self.waits.waits(actor(runtime.state, waiter.job), group):
                self._break_cycle(runtime, waiter.job, waiter.ticket)

    def lost_grant(self, group: str, job: str, epoch: int) -> None:
        """A grant was decided but its caller went away before reading it: yield for it."""
        runtime = self.groups.get(group)
        if runtime is None:
            return
        try:
            done = self._apply(runtime, events.LostGrant(job, epoch))
        except UnavailableError as error:  # the job's next call finds it holding
            log.warning("yield for job %s in %s not persisted: %s", job, group, error)
            return
        if any(isinstance(action, actions.Yielded) for action in done):
            log.info("job %s left before reading its grant of %s: yielded for it", job, group)

    def yield_(self, group: str, job: str, lease_id: str, secret: str) -> actions.Yielded:
        """Give the group up (holder, or a preempted job acknowledging)."""
        runtime, _ = self.job_lease(group, job, lease_id, secret)
        for action in self._apply(runtime, events.Yield(job)):
            if isinstance(action, actions.Yielded):
                return action
        raise AssertionError("a yield transition always answers")  # pragma: no cover

    def put_group(self, spec: GroupSpec) -> GroupState:
        """Create or replace a group's spec."""
        runtime = self.groups.get(spec.name)
        if runtime is not None:
            self._apply(runtime, events.PutGroup(spec))
            return runtime.state
        runtime = GroupRuntime(new_group(spec), EventRing(self._ring_size))
        self.groups[spec.name] = runtime
        self.metrics.groups.set(len(self.groups))
        self.metrics.set_queue_depth(spec.name, 0)
        self.store.save_group(runtime.state)
        self._record(runtime, actions.Record(Kind.GROUP_PUT))
        return runtime.state

    def delete_group(self, group: str, force: bool) -> None:
        """Delete a group; refused while held unless `force`."""
        runtime = self.group(group)
        self._apply(runtime, events.DeleteGroup(force))

    def group(self, name: str) -> GroupRuntime:
        """The runtime of group `name`."""
        runtime = self.groups.get(name)
        if runtime is None:
            raise NotFoundError(f"group: {name!r} does not exist")
        return runtime

    # -- watching ---------------------------------------------------------------------

    def watch(self, group: str) -> asyncio.Queue[EventEntry | None]:
        """A queue of the events of `group` ("" for all); None marks the end."""
        return self._watch.watch(self.group(group) if group else None)

    def unwatch(self, group: str, queue: asyncio.Queue[EventEntry | None]) -> None:
        """Stop delivering to `queue`."""
        self._watch.unwatch(self.groups.get(group), queue)

    def snapshot_entry(self, runtime: GroupRuntime) -> EventEntry:
        """A SNAPSHOT event for `runtime`'s current state."""
        s = runtime.state
        return EventEntry(0, self.clock(), s.name, "snapshot", "", "", 0.0, 0, s)

    # -- the core loop ----------------------------------------------------------------

    def _apply(self, runtime: GroupRuntime, event: events.Event) -> tuple[actions.Action, ...]:
        """Step the core, persist, execute the actions. Raises (changing nothing) on refusal."""
        before = runtime.state
        now = self.clock()
        transition = step(before, event, now)
        after = transition.state
        if after is None:
            self._drop_group(runtime, transition.actions)
            return transition.actions
        new_holder = False
        deferred = False
        if after is not before:
            deferred = self._persist(before, after, transition.actions)
            runtime.state = after
            new_holder = self.waits.update(before, after)
            self._leases.follow(before, after)
        followups: list[events.Event] = []
        self._take_effect(runtime, transition.actions, deferred, now, followups)
        metered.follow_transition(self.metrics, before, after)
        self._schedule(runtime)
        for followup in followups:
            if self.groups.get(after.name) is runtime:
                self._apply(runtime, followup)
        if new_holder and self.groups.get(after.name) is runtime:
            self._check_waiters(runtime)
        return transition.actions


__all__ = ["STORE_RETRY_SECONDS", "Engine", "Registration", "SwitchRunner"]
