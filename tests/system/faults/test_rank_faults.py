"""Faults of jobs of many ranks: the job fails cleanly, its other ranks are told, nothing of
another job is touched, and the group goes on.

Cases:
- a rank that never quiesces: two real ranks (processes joined by gloo, `RankedClient`,
  a real scheduler); rank 1 stays in its phase past the quiesce deadline. Rank 0 fails the
  phase with DeadlineExceededError naming rank 1 and gives the group back; rank 1 is told
  when it comes out (its barrier fails); another job waiting for the group is granted.
- a rank killed mid-switch: real `rlslice scheduler` and `rlslice agent` processes, the
  `app` backend; job ddp-a is two rank processes (`appjob.py`, `RANK` 0 and 1) registered
  under one job, job b one process. Rank 1 is held in its OFFLOAD and killed there: the
  attempt fails with a reason naming rank 1 (rank 0 rolled back), the retry finds rank 1's
  process gone and parks the rest of the job (its bytes unchanged), the waiter b is
  granted (the group goes on), and b's bytes stay intact through ddp-a leaving.
- a node cut off mid-switch (nftables drops every packet between the scheduler and node
  n2's agent while the job's rank on n2 is offloading): the waiter's acquire fails with
  ABORTED naming n2 within two attempts' deadlines; after the heal the job's ranks on both
  nodes come back with their bytes intact when it acquires again, the other job was
  never commanded, and the group goes on (the other job is granted next).

torch is required: with RLSLICE_REQUIRE_TORCH=1 (CI) a missing torch fails instead of skipping.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rlslice import AbortedError
from rlslice.client import AsyncClient
from rlslice.testing import child_env, free_port, scheduler_for_tests

from .conftest import eventually, proc_state
from .test_workload_stream_cut import APPJOB, AppJob

if os.environ.get("RLSLICE_REQUIRE_TORCH") == "1":
    import torch  # noqa: F401
else:
    pytest.importorskip("torch")

RANKJOB = Path(__file__).resolve().parents[2] / "client" / "rankjob.py"


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


MiB = 1 << 20


async def start_app_rank(f: Any, job: str, rank: int | None, node: str = "n1") -> AppJob:
    """An `appjob.py` process of `job` on `node` (with `RANK` when `rank` is given), its
    workload stream open."""
    env = child_env()
    env.pop("RANK", None)
    if rank is not None:
        env["RANK"] = str(rank)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(APPJOB),
        str(f.cluster.agents[node].socket_path),
        job,
        "g",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=(f.cluster.work / f"{job}-{rank}-{node}.log").open("ab"),
        env=env,
    )
    running = AppJob(process)
    assert "pid" in await asyncio.wait_for(running.answers.get(), 30)
    await running.event("connected", timeout=30)
    return running


async def test_a_rank_killed_mid_switch_fails_the_switch_by_name_and_the_group_goes_on(
    faults: Any,
) -> None:
    async with faults() as f:
        await f.put_group(name="g", backend="app", headroom_bytes=1 << 50)
        ranks = [await start_app_rank(f, "ddp-a", 0), await start_app_rank(f, "ddp-a", 1)]
        other = await start_app_rank(f, "b", None)
        a = AsyncClient(job="ddp-a", group="g", scheduler=f.address, lease_seconds=30)
        b = AsyncClient(job="b", group="g", scheduler=f.address, lease_seconds=30)
        try:
            await a.acquire(timeout=30)  # rank 0's one acquire, for the job
            hashes = [
                (await r.call(op="init", size=MiB, seed=i))["hash"] for i, r in enumerate(ranks)
            ]
            await ranks[1].call(op="gate", closed=True)
            waiting = asyncio.ensure_future(b.acquire(timeout=60))
            await eventually(lambda: _queued(f, "b"), timeout=30)
            await a.yield_()
            await ranks[1].event("offloading", timeout=30)  # mid-switch: rank 1 is moving
            ranks[1].process.kill()
            # The attempt fails naming rank 1 and rank 0 is brought back; the scheduler's
            # retry finds rank 1's process gone (its state with it) and parks the rest of
            # the job: the waiter is granted, the group goes on.
            grant = await asyncio.wait_for(waiting, 60)
            assert grant.epoch > 0
            assert (await f.group()).holder == "b"
            logs = "".join(p.read_text() for p in f.cluster.work.glob("*.log"))
            assert re.search(r"workload 1 of job ddp-a: .*\(rank 1 \(pid \d+\)\)", logs), logs[
                -3000:
            ]
            assert re.search(r"job ddp-a: rank 1 \(pid \d+\) has exited", logs), logs[-3000:]
            # Nothing of rank 0 is lost: parked, its bytes unchanged.
            assert await ranks[0].digest() == (hashes[0], False)
            assert proc_state(ranks[0].pid) not in ("T", "")
            assert [e["event"] for e in _drain(other)] in ([], ["restoring", "restored"])
            digest = (await other.call(op="init", size=MiB, seed=7))["hash"]
            assert await other.digest() == (digest, True)
            # The job is broken: it leaves (rank 0's driver closes); the group goes on.
            await a.close()
            await b.yield_()
            again = await b.acquire(timeout=30)
            assert again.epoch >= grant.epoch
            assert await other.digest() == (digest, True)
            await b.yield_()
        finally:
            await b.close()
            await a.close()
            for running in [*ranks, other]:
                await running.stop()


def _drain(job: AppJob) -> list[dict[str, Any]]:
    events = []
    while not job.events.empty():
        events.append(job.events.get_nowait())
    return events


async def _queued(f: Any, job: str) -> bool:
    return job in (await f.group()).queue


#: The scheduler's deadline for each call to an agent in the node-cut test.
RPC_TIMEOUT = 3.0
#: Two switch attempts, each a Status and a Switch call cut off at RPC_TIMEOUT, plus room
#: for a loaded 2-core machine (as test_partitions.py).
SWITCH_BOUND = 2 * 2 * RPC_TIMEOUT + 6.0


async def test_a_node_cut_off_mid_switch_fails_it_by_node_and_the_job_comes_back_whole(
    faults: Any, nft: Any
) -> None:
    cluster = {"nodes": ("n1", "n2"), "agent_rpc_timeout": RPC_TIMEOUT}
    async with faults(**cluster) as f:
        await f.put_group(name="g", backend="app", headroom_bytes=1 << 50)
        ranks = [
            await start_app_rank(f, "ddp-a", 0, "n1"),
            await start_app_rank(f, "ddp-a", 1, "n2"),
        ]
        other = await start_app_rank(f, "b", None, "n1")
        port = int(f.cluster.agents["n2"].service.address.rsplit(":", 1)[1])
        a = AsyncClient(job="ddp-a", group="g", scheduler=f.address, lease_seconds=30)
        b = AsyncClient(job="b", group="g", scheduler=f.address, lease_seconds=30)
        try:
            await a.acquire(timeout=30)
            hashes = [
                (await r.call(op="init", size=MiB, seed=i))["hash"] for i, r in enumerate(ranks)
            ]
            await ranks[1].call(op="gate", closed=True)
            waiting = asyncio.ensure_future(b.acquire(timeout=60))
            await eventually(lambda: _queued(f, "b"), timeout=30)
            await a.yield_()
            await ranks[1].event("offloading", timeout=30)  # mid-switch, on n2
            rules = nft.cut_link(port)
            cut = time.monotonic()
            await ranks[1].call(op="gate", closed=False)  # n2 finishes, unheard
            with pytest.raises(AbortedError, match="node n2") as failed:
                await waiting
            assert time.monotonic() - cut <= SWITCH_BOUND
            print(f"the waiter was told: {failed.value}")
            for rule in rules:
                nft.heal(rule)
            assert other.events.empty()  # b was never commanded
            # The job comes back whole: both ranks' bytes on their devices, unchanged.
            await a.acquire(timeout=60)
            for rank, digest in zip(ranks, hashes, strict=True):
                assert await rank.digest() == (digest, True)
                assert proc_state(rank.pid) not in ("T", "")
            await f.check()
            # The group goes on: the other job is granted next.
            waiting = asyncio.ensure_future(b.acquire(timeout=60))
            await eventually(lambda: _queued(f, "b"), timeout=30)
            await a.yield_()
            assert (await waiting).epoch > 0
            assert (await f.group()).holder == "b"
            for rank in ranks:
                assert (await rank.digest())[1] is False  # parked by the switch
            await b.yield_()
        finally:
            await b.close()
            await a.close()
            for running in [*ranks, other]:
                await running.stop()


TRAIN = Path(__file__).resolve().parents[3] / "examples" / "ddp_tiny" / "train.py"


def start_ddp_job(
    work: Path, job: str, seed: int, steps: int, extra_env: dict[str, str], *flags: str
) -> list[subprocess.Popen[bytes]]:
    """Two ranks of examples/ddp_tiny/train.py, torchrun-style; logs and JSON in `work`."""
    port = str(free_port())
    processes = []
    for rank in range(2):
        env = {
            **child_env(),
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            **extra_env,
        }
        argv = [
            sys.executable, str(TRAIN), "--job", job, "--group", "g", "--seed", str(seed),
            "--steps", str(steps), "--quiet", "--quiesce-seconds", "20",
            "--out", str(work / f"{job}-{'-'.join(flags) or 'sliced'}-{rank}.json"), *flags,
        ]  # fmt: skip
        log = (work / f"{job}-{rank}.log").open("ab")
        processes.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT))
        log.close()
    return processes


def finished(processes: list[subprocess.Popen[bytes]], timeout: float) -> list[int]:
    codes = []
    for process in processes:
        try:
            codes.append(process.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            process.kill()
            codes.append(process.wait())
    return codes


async def test_a_rank_of_a_real_ddp_job_killed_fails_its_job_clearly_and_not_the_other(
    faults: Any, tmp_path: Path
) -> None:
    """ddp_tiny jobs (gloo, `RankedClient`, `app` backend): ddp-b alone first, then ddp-a
    and, once ddp-a holds the group, ddp-b time-sliced with it; rank 1 of ddp-a is killed
    once they take turns.
    Rank 0 of ddp-a ends with a clear error naming what broke; ddp-b finishes every step,
    its losses bit-identical to its run alone (nothing of it was touched)."""
    work = tmp_path / "jobs"
    work.mkdir()
    alone = start_ddp_job(work, "ddp-b", 2, 10, {}, "--alone")
    assert await asyncio.to_thread(finished, alone, 150) == [0, 0]
    async with faults() as f:
        await f.put_group(name="g", backend="app", headroom_bytes=1 << 50)
        env = {
            "RLSLICE_SCHEDULER": f.address,
            "RLSLICE_AGENT_SOCKET": str(f.cluster.agents["n1"].socket_path),
        }
        # The victim runs until it is killed, and the survivor starts once the victim holds
        # the GPUs: started together, either could run all its steps while the other was
        # still importing torch and joining gloo, and the jobs never took turns.
        victim = start_ddp_job(work, "ddp-a", 1, 1_000_000, env)
        survivor: list[subprocess.Popen[bytes]] = []
        try:
            await eventually(lambda: _held_by(f, "ddp-a"), timeout=60)
            survivor = start_ddp_job(work, "ddp-b", 2, 10, env)
            await eventually(lambda: _switched(f, 3), timeout=60)
            victim[1].kill()
            codes = await asyncio.to_thread(finished, survivor, 150)
            assert codes == [0, 0], (work / "ddp-b-0.log").read_text()[-3000:]
            first = await asyncio.to_thread(finished, victim[:1], 90)
            log = (work / "ddp-a-0.log").read_text()
            assert first != [0], log[-3000:]
            told = re.search(
                r".*(rank 1 \(pid \d+\) no longer answers|ranks lost each other|end of phase).*",
                log,
            )
            assert told, log[-3000:]
            print(f"ddp-a rank 0 was told: {told.group(0)}")
        finally:
            for process in [*victim, *survivor]:
                if process.poll() is None:
                    process.kill()
                    process.wait()
    by_run = {
        run: json.loads((work / f"ddp-b-{run}-0.json").read_text())["losses"]
        for run in ("--alone", "sliced")
    }
    assert len(by_run["sliced"]) == 10
    assert by_run["sliced"] == by_run["--alone"]


async def _held_by(f: Any, job: str) -> bool:
    return bool((await f.group()).holder == job)


async def _switched(f: Any, at_least: int) -> bool:
    return bool((await f.group()).switches >= at_least)
