"""The wait-for index across groups, kept beside the groups' states for the deadlock check.

Each group's state knows its own holder and queue; a cycle runs through several groups, so
the engine keeps who holds what and who waits for what across all of them, updated from each
transition's before and after states (a cost of a few comparisons when neither the holder
nor the queue changed). `scheduler.core.deadlock` does the search over it.
"""

from __future__ import annotations

from rlslice.scheduler.core import Deadlock, GroupState, closing_cycle


def graph_holder(state: GroupState) -> str | None:
    """The job the group's waiters wait on: the holder, or the job a switch is bringing in
    (it will hold once the switch is done, unless its caller left)."""
    if state.holder is not None:
        return state.holder
    switch = state.switch
    if switch is not None and (switch.ticket is not None or switch.detached):
        return switch.incoming
    return None


def _waiters(state: GroupState) -> frozenset[str]:
    # A waiter cut off by a scheduler restart waits for nobody until its call comes back.
    return frozenset(w.job for w in state.queue if w.attached)


class WaitIndex:
    """Who holds and who waits, over every group. Mutated on the engine's loop only."""

    __slots__ = ("held", "holders", "waiting")

    def __init__(self) -> None:
        self.holders: dict[str, str] = {}
        """Group -> the job its waiters wait on (see `graph_holder`)."""
        self.waiting: dict[str, set[str]] = {}
        """Job -> the groups it waits for (attached waiters only)."""
        self.held: dict[str, set[str]] = {}
        """Job -> the groups it holds (the inverse of `holders`)."""

    def update(self, before: GroupState | None, after: GroupState | None) -> bool:
        """Follow one group's transition (None: absent). True when the group got a new
        holder that jobs may already wait on."""
        either = after if after is not None else before
        if either is None:
            return False
        name = either.name
        old = graph_holder(before) if before is not None else None
        new = graph_holder(after) if after is not None else None
        if old != new:
            if old is not None:
                _discard(self.held, old, name)
                del self.holders[name]
            if new is not None:
                self.holders[name] = new
                self.held.setdefault(new, set()).add(name)
        if before is None or after is None or before.queue is not after.queue:
            was = _waiters(before) if before is not None else frozenset()
            now = _waiters(after) if after is not None else frozenset()
            for job in was - now:
                _discard(self.waiting, job, name)
            for job in now - was:
                self.waiting.setdefault(job, set()).add(name)
        return new is not None and new != old

    def waits(self, job: str, group: str) -> bool:
        """Whether `job` is an attached waiter of `group`."""
        return group in self.waiting.get(job, ())

    def cycle(self, job: str, group: str) -> Deadlock | None:
        """The wait-for cycle `job` waiting for `group` closes, if any. No search at all
        when `job` holds nothing (nobody can wait on it then)."""
        if not self.held.get(job):
            return None
        return closing_cycle(self.holders, self.waiting, job, group)


def _discard(index: dict[str, set[str]], job: str, group: str) -> None:
    groups = index.get(job)
    if groups is not None:
        groups.discard(group)
        if not groups:
            del index[job]
