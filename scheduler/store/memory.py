"""A store in memory: for tests and throwaway schedulers. Nothing survives the process,
but a `MemoryStore` object handed to a second scheduler in the same process does, which
is how restart behaviour is tested without files."""

from __future__ import annotations

from rlslice.scheduler.core import GroupState
from rlslice.scheduler.store.base import AgentRecord, Loaded


class MemoryStore:
    """Keeps the newest state of each group and every agent in dicts."""

    def __init__(self) -> None:
        self.groups: dict[str, GroupState] = {}
        self.agents: dict[str, AgentRecord] = {}

    async def load(self) -> Loaded:
        return Loaded(dict(self.groups), dict(self.agents))

    def save_group(self, state: GroupState) -> None:
        self.groups[state.name] = state  # states are immutable: no copy needed

    def delete_group(self, name: str) -> None:
        self.groups.pop(name, None)

    def save_agent(self, agent: AgentRecord) -> None:
        self.agents[agent.node] = agent

    def delete_agent(self, node: str) -> None:
        self.agents.pop(node, None)

    async def flush(self) -> None:
        return None

    @property
    def healthy(self) -> bool:
        return True

    def commit_now(self, group: str) -> bool:
        return True  # in memory, saved is as durable as it gets

    async def commit(self, group: str) -> None:
        return None

    async def close(self) -> None:
        return None
