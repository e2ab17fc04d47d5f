"""The engine's back half: what follows an accepted transition. Its actions are executed
(futures answered, switch tasks spawned, state released, ring entries recorded and
published) and the group's timer is kept at its next deadline; when they take effect
(after the commit that a grant or a switch start needs) is `_durability.py`'s rule.
`Engine` inherits both; every method runs on the loop thread.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Coroutine, Iterator
from typing import TYPE_CHECKING, Any

from rlslice._errors import UnavailableError
from rlslice.scheduler import _engine_metrics as metered
from rlslice.scheduler._leases import LeaseIndex
from rlslice.scheduler._runtime import EventEntry, GroupRuntime
from rlslice.scheduler._watch import WatchHub
from rlslice.scheduler.clock import LoopClock
from rlslice.scheduler.core import actions, deadline, events
from rlslice.scheduler.core.state import Switch
from rlslice.scheduler.core.waits import WaitIndex
from rlslice.scheduler.metrics import SchedulerMetrics
from rlslice.scheduler.store import Store

if TYPE_CHECKING:
    from rlslice.scheduler.engine import SwitchRunner

#: Seconds before an internal event (a timer, a switch's result) whose transition the store
#: could not persist is applied again.
STORE_RETRY_SECONDS = 0.5

log = logging.getLogger("rlslice.scheduler.engine")


class _Execution:
    """Executing transitions' actions, for `Engine` (which sets these attributes)."""

    store: Store
    runner: SwitchRunner
    metrics: SchedulerMetrics
    clock: LoopClock
    groups: dict[str, GroupRuntime]
    waits: WaitIndex
    _leases: LeaseIndex
    _watch: WatchHub
    _seq: itertools.count[int]
    _tasks: set[asyncio.Task[None]]
    _closed: bool

    if TYPE_CHECKING:

        def _apply(
            self, runtime: GroupRuntime, event: events.Event
        ) -> tuple[actions.Action, ...]: ...

    def _execute(
        self,
        runtime: GroupRuntime,
        action: actions.Action,
        now: float,
        followups: list[events.Event],
    ) -> None:
        metered.count_action(self.metrics, runtime.state.name, action)
        if isinstance(action, actions.GrantAction):
            # No ticket: a switch resumed after a restart; the job's next Acquire finds it holding.
            future = runtime.calls.pop(action.ticket, None) if action.ticket is not None else None
            if future is not None and not future.done():
                future.set_result(action)
        elif isinstance(action, actions.Fail):
            future = runtime.calls.pop(action.ticket, None)
            if future is not None and not future.done():
                future.set_exception(action.kind(action.reason))
        elif isinstance(action, actions.StartSwitch):
            if not self.runner.nodes_for(runtime.state.spec):
                # No agents: nothing to move, the switch is a pure lock handoff.
                followups.append(events.SwitchDone(action.switch.epoch))
            else:
                runtime.switch_task = self._spawn(self._run_switch(runtime, action.switch))
        elif isinstance(action, actions.ReleaseState):
            if self.runner.nodes_for(runtime.state.spec):
                release = self.runner.release(runtime.state.spec, action.job, action.force)
                self._spawn(self._after_switch(runtime, release))
        elif isinstance(action, actions.HoldEnded):
            runtime.busy.add(now - action.seconds, now)
        elif isinstance(action, actions.Record):
            self._record(runtime, action)

    def _record(self, runtime: GroupRuntime, record: actions.Record) -> None:
        state = runtime.state
        metered.count_record(self.metrics, state.name, record)
        seq, now, kind = next(self._seq), self.clock(), record.kind.value
        runtime.ring.add(
            seq, now, kind, record.job, record.detail, record.seconds, record.bytes, state
        )
        if self._watch.wanted(runtime):
            entry = EventEntry(
                seq, now, state.name, kind, record.job, record.detail, record.seconds,
                record.bytes, state,
            )  # fmt: skip
            self._watch.publish(runtime, entry)

    def _drop_group(self, runtime: GroupRuntime, done: tuple[actions.Action, ...]) -> None:
        name = runtime.state.name
        followups: list[events.Event] = []
        for action in done:
            self._execute(runtime, action, self.clock(), followups)
        if runtime.timer is not None:
            runtime.timer.cancel()
        self._leases.drop_group(runtime.state)
        self._watch.end(runtime)
        del self.groups[name]
        self.waits.update(runtime.state, None)
        self.store.delete_group(name)
        self.metrics.forget_group(name)
        self.metrics.groups.set(len(self.groups))

    def _schedule(self, runtime: GroupRuntime) -> None:
        """Keep one timer per group at its next deadline. A later deadline keeps the earlier
        timer (it fires, finds nothing due and re-arms): cheaper than re-arming on every
        keep-alive."""
        due = deadline(runtime.state)
        if due is None or self._closed:
            return
        if runtime.timer is not None and runtime.timer_at is not None and runtime.timer_at <= due:
            return
        if runtime.timer is not None:
            runtime.timer.cancel()
        loop = asyncio.get_running_loop()
        runtime.timer_at = due
        # One clock: the timer fires at the very loop time the state's deadline names.
        runtime.timer = loop.call_at(self.clock.loop_time(due), self._fire, runtime)

    def _fire(self, runtime: GroupRuntime) -> None:
        runtime.timer = None
        runtime.timer_at = None
        if self.groups.get(runtime.state.name) is not runtime:
            return
        try:
            self._apply(runtime, events.Tick())
        except UnavailableError:
            # The store cannot persist what the tick would do: nothing changed; try again.
            if not self._closed:
                loop = asyncio.get_running_loop()
                runtime.timer_at = self.clock() + STORE_RETRY_SECONDS
                runtime.timer = loop.call_at(
                    self.clock.loop_time(runtime.timer_at), self._fire, runtime
                )

    async def _run_switch(self, runtime: GroupRuntime, switch: Switch) -> None:
        try:
            result = await self.runner.run_switch(runtime.state, switch)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a bug in the coordinator must not wedge the group
            log.exception("switch of group %s failed unexpectedly", runtime.state.name)
            result = events.SwitchFailed(switch.epoch, f"internal error: {error!r}")
        while self.groups.get(runtime.state.name) is runtime and not self._closed:
            try:
                self._apply(runtime, result)
                return
            except UnavailableError:
                # Not persisted, so not granted: the result is applied once the store is back.
                await asyncio.sleep(STORE_RETRY_SECONDS)

    async def _after_switch(
        self, runtime: GroupRuntime, release: Coroutine[Any, Any, None]
    ) -> None:
        """Release a job's state once the group's switch in flight has ended: a switch
        planned before the job left could still snapshot it, parking state that nobody
        would ever free (and freezing its processes for good). A switch still held for its
        store write (`_commit_then`) starts when that lands: wait for the writes first."""
        if runtime.commits:
            await asyncio.wait(set(runtime.commits))
        switch = runtime.switch_task
        if switch is not None and not switch.done():
            await asyncio.wait({switch})
        await release

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _busy_fractions(self) -> Iterator[tuple[str, float]]:
        now = self.clock()
        for name, runtime in list(self.groups.items()):
            holding = runtime.state.holder_since if runtime.state.holder else None
            yield name, runtime.busy.fraction(now, holding)
