"""Every rank of a job of many ranks is known to its node's agent, under the one job.

Case: two real ranks (processes joined by gloo, `RankedClient`, a real scheduler) with
`RLSLICE_AGENT_SOCKET` set, no offload loop (a backend other than `app`): rank 1 registers
its own process when its `RankedClient` is built, rank 0's client at its first acquire; the
agent lists both pids under the job while the phase runs, and both ranks finish.

torch is required: with RLSLICE_REQUIRE_TORCH=1 (CI) a missing torch fails instead of skipping.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rlslice.snapshot_agent import RunningAgent
from rlslice.testing import free_port, scheduler_for_tests
from rlslice.v1alpha1 import agent_pb2 as apb

from .conftest import eventually

if os.environ.get("RLSLICE_REQUIRE_TORCH") == "1":
    import torch  # noqa: F401
else:
    pytest.importorskip("torch")

RANKJOB = Path(__file__).resolve().parents[1] / "client" / "rankjob.py"


def start_ranks(scheduler: str, socket_path: str) -> list[subprocess.Popen[str]]:
    """Two rank processes of job ddp-reg (tests/client/rankjob.py), joined by gloo; rank 0
    keeps its one phase open for a while, so the agent can be asked meanwhile."""
    port = str(free_port())
    ranks = []
    for rank in range(2):
        env = {
            **os.environ,
            "PYTHONSAFEPATH": "1",
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "RLSLICE_AGENT_SOCKET": socket_path,
            "STALL_RANK": "0",
            "STALL_SECONDS": "8",
        }
        argv = [sys.executable, str(RANKJOB), scheduler, "ddp-reg", "gpus", "1"]
        ranks.append(
            subprocess.Popen(
                argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    return ranks


async def job_pids(stub: Any, job: str) -> set[int]:
    status: apb.AgentStatus = await stub.Status(apb.AgentStatusRequest())
    return {pid for entry in status.jobs if entry.job == job for pid in entry.pids}


async def test_every_rank_registers_its_own_process_under_the_one_job(
    agent: RunningAgent, stub: Any
) -> None:
    async with scheduler_for_tests(groups=["gpus"]) as sched:
        ranks = start_ranks(sched.address, str(agent.socket_path))
        try:
            want = {process.pid for process in ranks}
            await eventually(lambda: _registered(stub, want), timeout=60)
            for process in ranks:
                out, err = await asyncio.to_thread(process.communicate, timeout=90)
                answer = json.loads([line for line in out.splitlines() if line][-1])
                assert "error" not in answer, err[-2000:]
                assert answer["epochs"][0] > 0
        finally:
            for process in ranks:
                if process.poll() is None:
                    process.kill()
                    process.wait()


async def _registered(stub: Any, want: set[int]) -> bool:
    return await job_pids(stub, "ddp-reg") == want
