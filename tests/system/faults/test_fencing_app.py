"""The `app` backend fences a job without moving a tensor.

A fencing snapshot (option `fence=1`, sent by the scheduler for a holder whose lease lapsed)
of a real running process: the process is stopped (SIGSTOP, /proc shows 'T') and no
OFFLOAD reaches its workload stream (an offload under a running step must never happen);
the restore that follows resumes it first, then sends RESTORE (a no-op for a workload
that holds nothing). A plain snapshot still offloads.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from rlslice.snapshot_agent.backends.app import AppBackend
from rlslice.snapshot_agent.backends.base import (
    BackendContext,
    JobHandle,
    OffloadAction,
    WorkloadAnswer,
)

from .conftest import eventually, proc_state


class RecordingLink:
    """A workload stream that records the commands it gets and holds 1 KiB."""

    modes = frozenset({"offload"})
    tags: tuple[str, ...] = ()
    local_server = None
    pid = 0
    rank: int | None = None

    def __init__(self) -> None:
        self.commands: list[OffloadAction] = []

    async def command(
        self,
        action: OffloadAction,
        *,
        epoch: int,
        discard_tags: Sequence[str],
        timeout: float,
        offload_tags: Sequence[str] | None = None,
    ) -> WorkloadAnswer:
        self.commands.append(action)
        return WorkloadAnswer(ok=True, bytes=1024 if action is OffloadAction.OFFLOAD else 0)


@pytest.fixture
def running() -> Iterator[int]:
    process = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.01)"])
    try:
        yield process.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGCONT)
        process.kill()
        process.wait(10)


async def test_a_fencing_snapshot_stops_the_job_and_moves_nothing(
    running: int, tmp_path: Path
) -> None:
    backend = AppBackend(BackendContext("n1", tmp_path))
    link = RecordingLink()
    fence = JobHandle("a", "g", (running,), (link,), {"fence": "1"})
    outcome = await backend.snapshot(fence, deadline=time.time() + 10)
    assert outcome.bytes == 0
    assert proc_state(running) == "T"
    assert link.commands == []  # no OFFLOAD under a step that may be running
    await backend.restore(JobHandle("a", "g", (running,), (link,)), deadline=time.time() + 10)
    await eventually(lambda: proc_state(running) not in ("T", ""))
    assert link.commands == [OffloadAction.RESTORE]


async def test_a_plain_snapshot_still_offloads(running: int, tmp_path: Path) -> None:
    backend = AppBackend(BackendContext("n1", tmp_path))
    link = RecordingLink()
    outcome = await backend.snapshot(
        JobHandle("a", "g", (running,), (link,)), deadline=time.time() + 10
    )
    assert outcome.bytes == 1024
    assert link.commands == [OffloadAction.OFFLOAD]
    await asyncio.sleep(0)
    assert proc_state(running) != "T"
