"""The `Store` protocol: where the scheduler keeps what must survive a restart.

Invariant 6 of DESIGN.md: after a restart the holder, the queue order, the parked set and
the epochs come back. A store therefore keeps, per group, the whole `GroupState` (spec,
leases with a *hash* of each secret, holder, queue in order, resident and parked sets,
faulted jobs, epoch, the switch in flight, held seconds), plus the agents that registered
and the last event sequence number. `codec.encode_group` / `decode_group` turn a state
into a JSON-able dict and back; every store uses them, so the shape is defined once.

Contract, for every implementation (memory, SQLite, Kubernetes):

- `load()` is called once, before serving, and returns everything saved.
- `save_group(state)` is called after every accepted event, on the event loop, in order.
  It must be cheap and must not block: write at once (SQLite) or record the newest state
  per group and write it in the background (Kubernetes). The latest call for a group wins.
- `delete_group(name)` forgets a group; `save_agent` / `delete_agent` keep the agents.
- `flush()` returns once everything saved so far is durable (a no-op when writes are
  synchronous). The scheduler awaits it on shutdown.
- `close()` flushes and releases resources; the store is not used afterwards.
- `healthy` is False while a write the store was given has failed and not succeeded
  again (the scheduler's `rlslice_scheduler_store_healthy` gauge reads it).
- `commit_now(group)` makes everything saved so far for `group` durable before it returns,
  where the store can write at once (SQLite, memory): True, or `StoreError` naming the
  store and why. A store that writes in the background (Kubernetes: HTTP calls) answers
  False and the engine awaits `commit(group)` instead.
- `async commit(group)` returns once `group`'s newest saved state is durable, or raises
  `StoreError` naming the store and why.

The engine's rule over these two (`scheduler/_durability.py`): a transition that grants or
starts a switch is committed before its grants and switch starts take effect. Committed at
once, a refused commit changes nothing (the caller is answered UNAVAILABLE); committed in
the background, the grants and switch starts are held until the commit lands, and when it
fails the grants are given back (their callers answered UNAVAILABLE) and the switches fail
before anything moved. Nothing is granted that could not be persisted.

A store that several scheduler replicas share is a `FencedStore` as well: leader election
fences it (`fence_with`), so a deposed leader's late write never lands.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from rlslice.scheduler.core import GroupState


class StoreError(Exception):
    """The store could not write: the message names the store and says why."""


@dataclass(frozen=True, slots=True)
class AgentRecord:
    """A node agent that registered with the scheduler."""

    node: str
    address: str
    backends: tuple[str, ...] = ()
    device_total_bytes: tuple[int, ...] = ()
    host_available_bytes: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    registered_at: float = 0.0


@dataclass(frozen=True, slots=True)
class Loaded:
    """Everything a store returns on start."""

    groups: dict[str, GroupState] = field(default_factory=dict)
    agents: dict[str, AgentRecord] = field(default_factory=dict)


@runtime_checkable
class Store(Protocol):
    """Persistence of group states and agents. See the module docstring for the contract."""

    async def load(self) -> Loaded:
        """Everything saved so far."""
        ...

    def save_group(self, state: GroupState) -> None:
        """Record the newest state of a group (cheap; may buffer)."""
        ...

    def delete_group(self, name: str) -> None:
        """Forget a group."""
        ...

    def save_agent(self, agent: AgentRecord) -> None:
        """Record (or replace) an agent."""
        ...

    def delete_agent(self, node: str) -> None:
        """Forget an agent."""
        ...

    @property
    def healthy(self) -> bool:
        """False while a write the store was given has failed and not succeeded again."""
        ...

    def commit_now(self, group: str) -> bool:
        """Make `group`'s saved state durable now: True; False when this store cannot
        write at once (await `commit`). Raises StoreError naming the store and why."""
        ...

    async def commit(self, group: str) -> None:
        """Return once `group`'s newest saved state is durable; StoreError if it cannot be."""
        ...

    async def flush(self) -> None:
        """Return once everything saved so far is durable."""
        ...

    async def close(self) -> None:
        """Flush and release resources."""
        ...


@runtime_checkable
class FencedStore(Store, Protocol):
    """A store several scheduler replicas share: only the leader may write to it."""

    def fence_with(
        self, leading: Callable[[], bool], confirm: Callable[[], Awaitable[None]]
    ) -> None:
        """Write only while `leading()`, and await `confirm()` right before each write (it
        raises when this replica lost the lease), so a deposed leader's write never lands."""
        ...
