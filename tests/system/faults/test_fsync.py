"""fsync errors under the SQLite store: the scheduler grants nothing it could not persist,
says so, and recovers when the disk does. A real `rlslice scheduler` process whose fsyncs
of the store's folder fail with EIO while the test says so (`fsyncfault`: an LD_PRELOAD
shim, built by the fixture); its writes are untouched, as under a disk whose write-back
fails.

Cases:
- an Acquire that would be granted is refused with UNAVAILABLE naming the store file and
  "disk I/O error"; no holder, no queue; the refusal counted and the store reported
  unhealthy in the scheduler's /metrics; a job's client retrying through the fault is
  granted once fsyncs work again, and a scheduler SIGKILLed then finds that grant;
- a Yield that would hand the group over is refused; the scheduler SIGKILLed while fsyncs
  still fail and restarted (still failing) finds the old holder and epoch, not the refused
  handover; healed, the Yield goes through and the waiting client is granted;
- the store alone, SIGKILLed right after a refused commit: the file holds the state last
  committed, not the refused one (a failed fsync leaves the transaction's frames in the
  log, and SQLite would replay them at the next open; the store undoes them at once);
  healed, the same commit goes through and a kill keeps it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from rlslice.adapters.channel import open_channel
from rlslice.client import AsyncClient
from rlslice.scheduler.store import SQLiteStore
from rlslice.testing import Cluster, child_env, free_port
from rlslice.v1alpha1 import scheduler_pb2 as pb
from rlslice.v1alpha1 import scheduler_pb2_grpc

from . import fsyncfault
from .conftest import eventually
from .fsyncfault import FsyncFault

#: Seconds from the disk's recovery to the grant: the client's backoff cap (2 s), an RPC,
#: and a wide margin for a loaded machine.
RECOVERY_BOUND = 10.0


@pytest.fixture
def fsync_fault(tmp_path: Path) -> FsyncFault:
    """The shim built for this test; fsyncs under `tmp_path / "store"` fail on `fail()`.

    Without gcc the test skips; under CI (`CI=true`) it fails instead."""
    why = fsyncfault.missing()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"fsync faults are required in CI: {why}")
        pytest.skip(why)
    (tmp_path / "store").mkdir()
    return FsyncFault(tmp_path / "shim", tmp_path / "store").build()


class Scheduler:
    """A real `rlslice scheduler` (SQLite store under the fault's folder, metrics on)."""

    def __init__(self, fault: FsyncFault) -> None:
        self.metrics_port = free_port()
        args = ("--metrics-port", str(self.metrics_port))
        self.cluster = Cluster(fault.under, nodes=(), scheduler_args=args)
        self.cluster.scheduler.env = child_env(fault.env())
        self.store = self.cluster.store

    @property
    def address(self) -> str:
        return self.cluster.address

    async def metric(self, name: str) -> float:
        """One sample of the scheduler's /metrics (no labels)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        text = await asyncio.to_thread(_get, url)
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError(f"{name} not in /metrics")

    async def group(self) -> pb.GroupStatus:
        async with _stub(self.address) as stub:
            status: pb.GroupStatus = await stub.GetGroup(pb.GetGroupRequest(group="g"), timeout=10)
            return status

    async def kill_and_restart(self) -> None:
        self.cluster.scheduler.kill(signal.SIGKILL)
        await self.cluster.scheduler.restart()


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return str(answer.read().decode())


@contextlib.asynccontextmanager
async def _scheduler(fault: FsyncFault) -> AsyncIterator[Scheduler]:
    sched = Scheduler(fault)
    try:
        await sched.cluster.start()
        yield sched
    finally:
        fault.heal()
        sched.cluster.close()


@contextlib.asynccontextmanager
async def _stub(address: str) -> AsyncIterator[Any]:
    async with open_channel(address) as channel:
        yield scheduler_pb2_grpc.SchedulerStub(channel)


async def _lease(stub: Any, job: str) -> pb.RegisterResponse:
    lease: pb.RegisterResponse = await stub.Register(
        pb.RegisterRequest(job=job, group="g", lease_seconds=60), timeout=10
    )
    return lease


def _refusal(error: grpc.aio.AioRpcError, store: Path) -> None:
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    details = error.details() or ""
    assert "store: sqlite" in details
    assert str(store) in details
    assert "disk I/O error" in details


async def test_failing_fsyncs_refuse_the_grant_naming_the_store_then_it_is_granted_and_kept(
    fsync_fault: FsyncFault,
) -> None:
    async with _scheduler(fsync_fault) as sched, _stub(sched.address) as stub:
        lease = await _lease(stub, "a")
        fsync_fault.fail()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Acquire(
                pb.AcquireRequest(job="a", group="g", lease_id=lease.lease_id, secret=lease.secret),
                timeout=10,
            )
        _refusal(refused.value, sched.store)
        status = await sched.group()
        assert status.holder == ""
        assert list(status.queue) == []
        assert await sched.metric("rlslice_scheduler_store_refusals_total") >= 1
        assert await sched.metric("rlslice_scheduler_store_healthy") == 0
        async with AsyncClient(job="b", group="g", scheduler=sched.address) as b:
            acquiring = asyncio.ensure_future(b.acquire(timeout=60))
            # The client retries the refusals by itself: more are counted, none granted.
            refusals = await sched.metric("rlslice_scheduler_store_refusals_total")
            await eventually(
                lambda: _more(sched, "rlslice_scheduler_store_refusals_total", refusals)
            )
            assert (await sched.group()).holder == ""
            loop = asyncio.get_running_loop()
            healed = loop.time()
            fsync_fault.heal()
            grant = await asyncio.wait_for(acquiring, RECOVERY_BOUND)
            print(f"fsync fault: granted {loop.time() - healed:.3f} s after the disk healed")
            assert (await sched.group()).holder == "b"
            assert await sched.metric("rlslice_scheduler_store_healthy") == 1
            await sched.kill_and_restart()
            status = await sched.group()
            assert status.holder == "b"
            assert status.epoch == grant.epoch


async def _more(sched: Scheduler, name: str, than: float) -> bool:
    return await sched.metric(name) > than


async def test_failing_fsyncs_hold_a_handover_through_a_kill_until_the_disk_heals(
    fsync_fault: FsyncFault,
) -> None:
    async with _scheduler(fsync_fault) as sched, _stub(sched.address) as stub:
        lease = await _lease(stub, "a")
        held = await stub.Acquire(
            pb.AcquireRequest(job="a", group="g", lease_id=lease.lease_id, secret=lease.secret),
            timeout=10,
        )
        async with AsyncClient(job="b", group="g", scheduler=sched.address) as b:
            waiting = asyncio.ensure_future(b.acquire(timeout=120))
            await eventually(lambda: _queued(sched, "b"))
            fsync_fault.fail()
            yield_ = pb.YieldRequest(
                job="a", group="g", lease_id=lease.lease_id, secret=lease.secret
            )
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Yield(yield_, timeout=10)
            _refusal(refused.value, sched.store)
            await sched.kill_and_restart()  # fsyncs still fail, before and after
            status = await sched.group()
            assert status.holder == "a"
            assert status.epoch == held.epoch
            await eventually(lambda: _queued(sched, "b"), 30)  # its client asked again
            assert not waiting.done()
            loop = asyncio.get_running_loop()
            healed = loop.time()
            fsync_fault.heal()
            await stub.Yield(yield_, timeout=10)
            grant = await asyncio.wait_for(waiting, RECOVERY_BOUND)
            print(f"fsync fault: handed over {loop.time() - healed:.3f} s after the disk healed")
            assert grant.epoch > held.epoch
            await b.yield_()


async def _queued(sched: Scheduler, job: str) -> bool:
    return job in (await sched.group()).queue


_COMMITTER = """
import sys
from rlslice.config import GroupSpec
from rlslice.scheduler.core import new_group
from rlslice.scheduler.store import SQLiteStore, StoreError
from pathlib import Path
store = SQLiteStore(sys.argv[1])
flag = Path(sys.argv[2])
state = new_group(GroupSpec(name="g"))
def at(epoch):
    return state.__class__(**{**{f: getattr(state, f) for f in state.__slots__}, "epoch": epoch})
store.save_group(at(1))  # no event loop: written and fsynced before it returns
store.commit_now("g")
flag.touch()
store.save_group(at(2))
try:
    store.commit_now("g")
    print("committed while failing", flush=True)
except StoreError as error:
    print("refused", error, flush=True)
sys.stdin.readline()  # the test heals the disk (or kills this process) meanwhile
store.commit_now("g")
print("committed", flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize(("heal", "epoch"), [(False, 1), (True, 2)], ids=["refused", "healed"])
def test_a_store_killed_after_a_refused_commit_holds_the_last_committed_state(
    fsync_fault: FsyncFault, heal: bool, epoch: int
) -> None:
    path = fsync_fault.under / "state.db"
    committer = subprocess.Popen(
        [sys.executable, "-c", _COMMITTER, str(path), str(fsync_fault.flag)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=child_env(fsync_fault.env()),
        text=True,
    )
    assert committer.stdin is not None
    assert committer.stdout is not None
    try:
        answer = committer.stdout.readline()
        assert answer.startswith("refused sqlite "), answer
        assert "disk I/O error" in answer
        if heal:
            fsync_fault.heal()
            committer.stdin.write("\n")
            committer.stdin.flush()
            assert committer.stdout.readline() == "committed\n"
        os.kill(committer.pid, signal.SIGKILL)
    finally:
        committer.kill()
        committer.wait(10)
    fsync_fault.heal()
    with _closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    loaded = asyncio.run(SQLiteStore(path).load())
    assert loaded.groups["g"].epoch == epoch


@contextlib.contextmanager
def _closing(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    try:
        yield db
    finally:
        db.close()
