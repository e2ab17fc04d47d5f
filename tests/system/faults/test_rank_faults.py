"""Faults of jobs of many ranks: the job fails cleanly, its other ranks are told, nothing of
another job is touched, and the group goes on.

Cases:
- a rank that never quiesces: two real ranks (processes joined by gloo, `RankedClient`,
  a real scheduler); rank 1 stays in its phase past the quiesce deadline. Rank 0 fails the
  phase with DeadlineExceededError naming rank 1 and gives the group back; rank 1 is told
  when it comes out (its barrier fails); another job waiting for the group is granted.

torch is required: with RLSLICE_REQUIRE_TORCH=1 (CI) a missing torch fails instead of skipping.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rlslice.client import AsyncClient
from rlslice.testing import scheduler_for_tests

from .conftest import eventually

if os.environ.get("RLSLICE_REQUIRE_TORCH") == "1":
    import torch  # noqa: F401
else:
    pytest.importorskip("torch")

RANKJOB = Path(__file__).resolve().parents[2] / "client" / "rankjob.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_ranks(scheduler: str, job: str, steps: int, **extra: str) -> list[subprocess.Popen[str]]:
    """Two rank processes of `job` (tests/client/rankjob.py), joined by gloo."""
    port = str(free_port())
    processes = []
    for rank in range(2):
        env = {
            **os.environ,
            "PYTHONSAFEPATH": "1",
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            **extra,
        }
        argv = [sys.executable, str(RANKJOB), scheduler, job, "gpus", str(steps)]
        processes.append(
            subprocess.Popen(
                argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    return processes


def answer(process: subprocess.Popen[str], timeout: float = 90.0) -> dict[str, Any]:
    out, err = process.communicate(timeout=timeout)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, f"rank exited {process.returncode} without an answer:\n{err[-3000:]}"
    result: dict[str, Any] = json.loads(lines[-1])
    return result


async def test_a_rank_that_never_quiesces_fails_its_job_by_name_and_the_group_goes_on() -> None:
    async with scheduler_for_tests(groups=["gpus"]) as sched:
        ranks = start_ranks(
            sched.address,
            "ddp-stall",
            steps=2,
            STALL_RANK="1",
            STALL_SECONDS="10",
            QUIESCE_SECONDS="3",
        )
        try:
            await eventually(
                lambda: _holder_is(sched, "ddp-stall"), timeout=60
            )  # both ranks started, rank 0 holds the group for the job
            async with AsyncClient(job="other", group="gpus", scheduler=sched.address) as other:
                grant = await asyncio.wait_for(other.acquire(), timeout=60)
                assert grant.epoch > 0
                assert (await sched.group("gpus")).holder == "other"
                first = await asyncio.to_thread(answer, ranks[0])
                assert first["error"] == "DeadlineExceededError", first
                assert "end of phase 'train'" in first["message"]
                assert re.search(r"\bRanks? 1\b", first["message"]), first["message"]
                second = await asyncio.to_thread(answer, ranks[1])
                assert second.get("error"), second  # told: the job cannot go on
                await other.yield_()
        finally:
            for process in ranks:
                if process.poll() is None:
                    process.kill()
                    process.wait()


async def _holder_is(sched: Any, job: str) -> bool:
    return bool((await sched.group("gpus")).holder == job)
