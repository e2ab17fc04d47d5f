"""The snapshot agent: one per node, moves jobs' device state between devices and host memory.

    from rlslice.snapshot_agent import AgentSettings, start_agent

    agent = await start_agent(AgentSettings(node="n1", state_dir=path))
    ...
    await agent.stop()

`rlslice agent` runs one from the command line; `rlslice up` runs one beside a scheduler.
Names are imported on first use, so the pure modules and the backends load without grpc.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlslice.snapshot_agent.agent import RunningAgent, start_agent
    from rlslice.snapshot_agent.settings import AgentSettings, SimSettings

__all__ = ["AgentSettings", "RunningAgent", "SimSettings", "start_agent"]


def __getattr__(name: str) -> object:
    if name in ("RunningAgent", "start_agent"):
        from rlslice.snapshot_agent import agent

        return getattr(agent, name)
    if name in ("AgentSettings", "SimSettings"):
        from rlslice.snapshot_agent import settings

        return getattr(settings, name)
    raise AttributeError(f"module 'rlslice.snapshot_agent' has no attribute {name!r}")
