"""The `app` backend moves every rank of a job or none.

Links are in-process `WorkloadLink`s (the boundary the agent's streams present), one per
rank process, each holding 1 KiB.

Cases:
- a two-rank job: a snapshot offloads both ranks at once (bytes summed), a restore brings
  both back;
- a rank that answers an error: the ranks that offloaded are restored, the error names
  the rank (`rank 1 (pid 202)`), another job's ranks get no command;
- a rank silent past the deadline: the others are restored; the error names the rank and
  says it did not answer by the deadline;
- a rank whose stream was seen and is gone while its process runs (its loop ended): the
  next move fails before any rank is commanded, naming that rank;
- a rank whose process exited: dropped from the job with a warning naming it; the other
  ranks move without it (its state is gone with it; the group goes on);
- the agent reads a rank from the workload process's own environment (`RANK`), and none
  from a process without it (real child processes).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from rlslice.snapshot_agent.backends.app import AppBackend
from rlslice.snapshot_agent.backends.base import (
    BackendContext,
    BackendError,
    JobHandle,
    OffloadAction,
    WorkloadAnswer,
)
from rlslice.snapshot_agent.local_service import environ_rank


class RankLink:
    """One rank's stream: records commands; can refuse or stay silent on OFFLOAD."""

    modes = frozenset({"offload"})
    tags = ("weights",)
    local_server = None

    def __init__(self, pid: int, rank: int | None, *, refuse: bool = False, silent: bool = False):
        self.pid = pid
        self.rank = rank
        self.refuse = refuse
        self.silent = silent
        self.commands: list[OffloadAction] = []
        self.offloaded = False

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
        if action is OffloadAction.OFFLOAD:
            if self.refuse:
                return WorkloadAnswer(ok=False, error="RuntimeError: CUDA error")
            if self.silent:
                await asyncio.sleep(timeout + 5)
            self.offloaded = True
            return WorkloadAnswer(ok=True, bytes=1024)
        moved = 1024 if self.offloaded else 0
        self.offloaded = False
        return WorkloadAnswer(ok=True, bytes=moved)


def backend(tmp_path: Path) -> AppBackend:
    return AppBackend(BackendContext(node="n1", state_dir=tmp_path))


def job(name: str, *links: RankLink) -> JobHandle:
    return JobHandle(job=name, group="g", pids=tuple(link.pid for link in links), workloads=links)


async def test_a_snapshot_offloads_every_rank_and_a_restore_brings_every_rank_back(
    tmp_path: Path,
) -> None:
    app = backend(tmp_path)
    ranks = (RankLink(201, 0), RankLink(202, 1))
    out = await app.snapshot(job("ddp-a", *ranks), deadline=time.time() + 10)
    assert out.bytes == 2048
    assert all(link.offloaded for link in ranks)
    back = await app.restore(job("ddp-a", *ranks), deadline=time.time() + 10)
    assert back.bytes == 2048
    assert not any(link.offloaded for link in ranks)


async def test_a_rank_that_fails_its_offload_fails_the_move_naming_it_and_the_others_come_back(
    tmp_path: Path,
) -> None:
    app = backend(tmp_path)
    other = (RankLink(301, 0), RankLink(302, 1))
    await app.snapshot(job("ddp-b", *other), deadline=time.time() + 10)
    before = [list(link.commands) for link in other]
    ranks = (RankLink(201, 0), RankLink(202, 1, refuse=True))
    with pytest.raises(BackendError, match=r"of job ddp-a: .*CUDA error \(rank 1 \(pid 202\)\)"):
        await app.snapshot(job("ddp-a", *ranks), deadline=time.time() + 10)
    assert ranks[0].commands == [OffloadAction.OFFLOAD, OffloadAction.RESTORE]
    assert not ranks[0].offloaded
    assert [list(link.commands) for link in other] == before  # nothing of ddp-b touched
    assert all(link.offloaded for link in other)


async def test_a_rank_silent_past_the_deadline_fails_the_move_and_the_others_come_back(
    tmp_path: Path,
) -> None:
    app = backend(tmp_path)
    ranks = (RankLink(201, 0), RankLink(202, 1, silent=True))
    with pytest.raises(BackendError, match=r"no answer by the deadline \(rank 1 \(pid 202\)\)"):
        await app.snapshot(job("ddp-a", *ranks), deadline=time.time() + 0.5)
    assert not ranks[0].offloaded
    assert OffloadAction.RESTORE in ranks[0].commands
    assert OffloadAction.RESTORE in ranks[1].commands  # it may have moved: told to restore


async def test_a_rank_whose_stream_is_gone_while_it_runs_fails_the_next_move_before_any_moves(
    tmp_path: Path,
) -> None:
    app = backend(tmp_path)
    first, second = RankLink(201, 0), RankLink(202, 1)
    await app.snapshot(job("ddp-a", first, second), deadline=time.time() + 10)
    await app.restore(job("ddp-a", first, second), deadline=time.time() + 10)
    commands = list(first.commands)
    # Rank 1's process still runs (the agent lists its pid), its stream is gone.
    alive = JobHandle(job="ddp-a", group="g", pids=(201, 202), workloads=(first,))
    with pytest.raises(BackendError, match=r"rank 1 \(pid 202\) no longer answers.*nothing moved"):
        await app.snapshot(alive, deadline=time.time() + 10)
    assert first.commands == commands
    assert not first.offloaded


async def test_a_rank_whose_process_exited_is_dropped_and_the_others_move_without_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = backend(tmp_path)
    first, second = RankLink(201, 0), RankLink(202, 1)
    await app.snapshot(job("ddp-a", first, second), deadline=time.time() + 10)
    await app.restore(job("ddp-a", first, second), deadline=time.time() + 10)
    out = await app.snapshot(job("ddp-a", first), deadline=time.time() + 10)  # 202 exited
    assert out.bytes == 1024
    assert first.offloaded
    assert "rank 1 (pid 202) has exited" in caplog.text
    back = await app.restore(job("ddp-a", first), deadline=time.time() + 10)
    assert back.bytes == 1024


def test_the_agent_reads_a_workloads_rank_from_its_own_environment() -> None:
    script = "import sys; sys.stdin.read()"
    with_rank = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, env={**os.environ, "RANK": "3"}
    )
    without = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if k != "RANK"},
    )
    try:
        assert environ_rank(with_rank.pid) == 3
        assert environ_rank(without.pid) is None
    finally:
        for process in (with_rank, without):
            process.communicate(b"")
    assert environ_rank(with_rank.pid) is None  # gone: unreadable
