"""Releasing a job on a real agent: a node that never knew the job is no failure.

Cases:
- a lock-only job (it never registered with the node's agent) is released on every node
  without a WARNING: the agent answers NOT_FOUND, which means "nothing here to drop";
- a release that really fails (the agent is gone) still logs a WARNING naming the node.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import pytest

from rlslice.config import GroupSpec
from rlslice.scheduler.coordinator import Coordinator
from rlslice.scheduler.store import AgentRecord
from rlslice.snapshot_agent import AgentSettings, SimSettings, start_agent

MiB = 1 << 20


async def test_a_lock_only_job_is_released_without_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    short = Path(tempfile.mkdtemp(prefix="rs-", dir="/tmp"))
    running = await start_agent(
        AgentSettings(
            node="n1",
            state_dir=short / "state",
            socket_path=short / "n1.sock",
            host_reserve_bytes=0,
            sim=SimSettings(root=short / "sim", capacity_bytes=64 * MiB, rate_gbps=0.0),
        )
    )
    coordinator = Coordinator(retries=0, status_timeout=5.0, token=running.token)
    coordinator.add_agent(AgentRecord(node="n1", address=running.address, backends=("sim",)))
    spec = GroupSpec(name="g", nodes=("n1",))
    try:
        with caplog.at_level(logging.DEBUG, logger="rlslice.scheduler.coordinator"):
            await coordinator.release(spec, "lock-only", force=False)
            await coordinator.release(spec, "lock-only", force=True)
        released = [r for r in caplog.records if "release of lock-only" in r.getMessage()]
        assert released, "the agent's NOT_FOUND answer is still logged, at DEBUG"
        assert all(r.levelno == logging.DEBUG for r in released)
        assert all("NOT_FOUND" in r.getMessage() for r in released)

        await running.stop(0)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="rlslice.scheduler.coordinator"):
            await coordinator.release(spec, "lock-only", force=True)
        (gone,) = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert "node n1: release of lock-only" in gone.getMessage()
    finally:
        await running.stop(0)
        await coordinator.close()
