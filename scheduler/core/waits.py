"""The wait-for index across groups, kept beside the groups' states for the deadlock check.

Each group's state knows its own holder and queue; a cycle runs through several groups, so
the engine keeps who holds what and who waits for what across all of them, updated from each
transition's before and after states (a cost of a few comparisons when neither the holder
nor the queue changed). `scheduler.core.deadlock` does the search over it.

The graph's nodes are *actors*, not jobs: a job registered with a session (one per client
object) is `job/session`, so two processes of one job that wait independently (a trainer
and a sampler in different groups) are two actors, and one does not count as blocked by
the other's wait. A job registered without one is its own actor (all its processes taken
as one thread, the conservative choice). Job ids are DNS labels, so `/` cannot be in one.
"""

from __future__ import annotations

from rlslice.scheduler.core import Deadlock, GroupState, WaitEdge, closing_cycle


def actor(state: GroupState, job: str) -> str:
    """The graph node of `job` in this group: `job/session`, or the job alone without one."""
    record = state.jobs.get(job)
    session = record.session if record is not None else ""
    return f"{job}/{session}" if session else job


def job_of(node: str) -> str:
    """The job id of a graph node."""
    return node.partition("/")[0]


def graph_holder(state: GroupState) -> str | None:
    """The actor the group's waiters wait on: the holder, or the job a switch is bringing in
    (it will hold once the switch is done, unless its caller left)."""
    if state.holder is not None:
        return actor(state, state.holder)
    switch = state.switch
    if switch is not None and (switch.ticket is not None or switch.detached):
        return actor(state, switch.incoming)
    return None


def _waiters(state: GroupState) -> frozenset[str]:
    # A waiter cut off by a scheduler restart waits for nobody until its call comes back.
    return frozenset(actor(state, w.job) for w in state.queue if w.attached)


class WaitIndex:
    """Who holds and who waits, over every group. Mutated on the engine's loop only."""

    __slots__ = ("held", "holders", "waiting")

    def __init__(self) -> None:
        self.holders: dict[str, str] = {}
        """Group -> the actor its waiters wait on (see `graph_holder`)."""
        self.waiting: dict[str, set[str]] = {}
        """Actor -> the groups it waits for (attached waiters only)."""
        self.held: dict[str, set[str]] = {}
        """Actor -> the groups it holds (the inverse of `holders`)."""

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

    def waits(self, node: str, group: str) -> bool:
        """Whether actor `node` (see `actor`) is an attached waiter of `group`."""
        return group in self.waiting.get(node, ())

    def cycle(self, node: str, group: str) -> Deadlock | None:
        """The wait-for cycle actor `node` waiting for `group` closes, if any, with job ids
        in its edges. No search at all when `node` holds nothing (nobody waits on it)."""
        if not self.held.get(node):
            return None
        found = closing_cycle(self.holders, self.waiting, node, group)
        if found is None:
            return None
        return Deadlock(
            tuple(WaitEdge(job_of(e.job), e.group, job_of(e.holder)) for e in found.edges)
        )


def _discard(index: dict[str, set[str]], job: str, group: str) -> None:
    groups = index.get(job)
    if groups is not None:
        groups.discard(group)
        if not groups:
            del index[job]
