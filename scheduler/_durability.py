"""The engine's durability rule: nothing is granted that could not be persisted.

A transition that grants, or starts a switch that moves state, is committed before those
actions take effect (`must_persist`). Every store declares how (`store.base`):

- a store that writes at once (`commit_now` answers True: SQLite, memory) commits inside
  the transition; when it refuses, nothing changes: the newest state to write is the old
  one again and the caller gets UnavailableError naming the store (internal events are
  applied again later);
- a store that writes in the background (`commit_now` answers False: Kubernetes) gets the
  transition applied, but its grants and switch starts are held until `await
  store.commit(group)` lands. When that fails, each held grant's caller fails UNAVAILABLE
  (naming the store) and the grant is given back; each held switch fails before it moved
  anything. Later events (a lapse, a cancel, a deletion) may overtake a held action: it
  takes effect only if it is still due.

`Engine` inherits it (through `_Execution`'s executing); every method runs on the loop
thread.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from rlslice._errors import UnavailableError
from rlslice.scheduler._execution import _Execution
from rlslice.scheduler._runtime import GroupRuntime
from rlslice.scheduler.core import GroupState, actions, events
from rlslice.scheduler.store import StoreError

log = logging.getLogger("rlslice.scheduler.engine")


class _Durability(_Execution):
    """Committing transitions before their grants and switch starts take effect."""

    if TYPE_CHECKING:

        def lost_grant(self, group: str, job: str, epoch: int) -> None: ...

    def _persist(
        self, before: GroupState, after: GroupState, done: tuple[actions.Action, ...]
    ) -> bool:
        """Save `after`; commit it first when `done` must persist. False: its actions may
        take effect now; True: the store writes in the background, hold them
        (`_take_effect`). Raises UnavailableError (nothing changed) when a store that
        commits at once refuses."""
        self.store.save_group(after)
        if not any(must_persist(action) for action in done):
            self._note_store()
            return False
        try:
            at_once = self.store.commit_now(after.name)
        except StoreError as error:
            self.store.save_group(before)  # the newest state to write is the old one again
            self._store_refused(after.name, error)
            raise UnavailableError(_refusal(error, "nothing changed")) from None
        if not at_once:
            return True
        self.metrics.store_healthy.set(1)
        return False

    def _take_effect(
        self,
        runtime: GroupRuntime,
        done: tuple[actions.Action, ...],
        deferred: bool,
        now: float,
        followups: list[events.Event],
    ) -> None:
        """Execute a transition's actions; when its commit is `deferred`, hold its grants
        and switch starts until the store has written it (`_commit_then`)."""
        held: list[actions.Action] = []
        for action in done:
            if deferred and must_persist(action):
                held.append(action)
            else:
                self._execute(runtime, action, now, followups)
        if held:
            committing = self._spawn(self._commit_then(runtime, tuple(held)))
            runtime.commits.add(committing)
            committing.add_done_callback(runtime.commits.discard)

    async def _commit_then(self, runtime: GroupRuntime, held: tuple[actions.Action, ...]) -> None:
        """Await the store's write of the group, then let the held grants and switches take
        effect; when the write fails, give them back (`_undo_held`)."""
        name = runtime.state.name
        try:
            await self.store.commit(name)
        except StoreError as error:
            self._store_refused(name, error)
            if self.groups.get(name) is runtime and not self._closed:
                self._undo_held(runtime, held, _refusal(error, "not granted"))
            return
        self._note_store()  # still unhealthy while the store refuses another group for good
        if self.groups.get(name) is not runtime or self._closed:
            return
        followups: list[events.Event] = []
        for action in held:
            if self._still_due(runtime, action):
                self._execute(runtime, action, self.clock(), followups)
        for followup in followups:
            if self.groups.get(name) is runtime:
                self._apply(runtime, followup)

    def _still_due(self, runtime: GroupRuntime, action: actions.Action) -> bool:
        """Whether a held grant or switch may still take effect now that it is stored:
        later events (a lapse, a cancel, a deletion) may have overtaken it meanwhile."""
        state = runtime.state
        if isinstance(action, actions.StartSwitch):
            return state.switch is not None and state.switch.epoch == action.switch.epoch
        if not isinstance(action, actions.GrantAction):
            return True
        if state.holder == action.job and state.epoch == action.epoch:
            if action.ticket is None or action.ticket in runtime.calls:
                return True
            self.lost_grant(state.name, action.job, action.epoch)  # its caller left meanwhile
            return False
        future = runtime.calls.pop(action.ticket, None) if action.ticket is not None else None
        if future is not None and not future.done():
            future.set_exception(UnavailableError("grant overtaken while it was stored; retry"))
        return False

    def _undo_held(
        self, runtime: GroupRuntime, held: tuple[actions.Action, ...], message: str
    ) -> None:
        """Give back what a failed commit held: grants (their callers fail UNAVAILABLE)
        and switch starts (failed before anything moved)."""
        for action in held:
            if isinstance(action, actions.GrantAction):
                future = runtime.calls.pop(action.ticket, None) if action.ticket else None
                if future is not None and not future.done():
                    future.set_exception(UnavailableError(message))
                undo: events.Event = events.LostGrant(action.job, action.epoch)
            elif isinstance(action, actions.StartSwitch):
                undo = events.SwitchFailed(action.switch.epoch, message, UnavailableError)
            else:  # pragma: no cover - only grants and switches are held
                continue
            try:
                self._apply(runtime, undo)
            except UnavailableError as error:
                log.warning("group %s: undoing an unwritten change: %s", runtime.state.name, error)

    def _store_refused(self, group: str, error: StoreError) -> None:
        self.metrics.store_refusals.inc()
        self.metrics.store_healthy.set(0)
        log.warning("group %s: refused, the store cannot persist it: %s", group, error)

    def _note_store(self) -> None:
        self.metrics.store_healthy.set(1 if self.store.healthy else 0)


def _refusal(error: StoreError, outcome: str) -> str:
    return f"store: {error}; the scheduler grants nothing it cannot persist ({outcome}; retry)"


def must_persist(action: actions.Action) -> bool:
    """Whether the transition emitting `action` must be durable before it takes effect: a
    grant (the fencing token a job may pass on), or a switch that moves state (a resumed
    one was persisted before the restart)."""
    if isinstance(action, actions.GrantAction):
        return True
    return isinstance(action, actions.StartSwitch) and not action.resume
