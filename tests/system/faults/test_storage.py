"""The SQLite store fails: the scheduler grants nothing it could not persist, says so, and
recovers when the store does. Real SQLite on a real filesystem: a 512 KiB tmpfs mounted for
the test and filled up; real SIGKILLs of a process in the middle of its writes.

Cases:
- a full filesystem: an Acquire that would be granted is refused with UNAVAILABLE naming
  the store file and the reason; nothing changed (no holder, no queue); the refusal is
  counted (`rlslice_scheduler_store_refusals_total`) and the store reported unhealthy;
  once space is freed the same call is granted, and a scheduler restarted from the file
  finds that grant (holder, epoch);
- a full filesystem under a yield that hands the group over: the Yield is refused, the
  holder still holds and the waiter waits; freed, the Yield goes through and the waiter is
  granted (its client retried nothing by hand);
- a process SIGKILLed while it commits states in a loop, at several points: the file
  passes `PRAGMA integrity_check` and loads, with every state the writer saw committed.

fsync errors (EIO from fsync and fdatasync under a real scheduler process) are in
`test_fsync.py`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from rlslice.adapters.channel import open_channel
from rlslice.client import AsyncClient
from rlslice.scheduler.store import SQLiteStore
from rlslice.testing import TestScheduler, child_env, scheduler_for_tests
from rlslice.v1alpha1 import scheduler_pb2 as pb
from rlslice.v1alpha1 import scheduler_pb2_grpc

from .conftest import eventually

if TYPE_CHECKING:
    from diskfault import SmallFs


def _metric(sched: TestScheduler, name: str) -> float:
    value = sched.running.metrics.registry.get_sample_value(name)
    return 0.0 if value is None else value


@asynccontextmanager
async def _stub(address: str) -> AsyncIterator[Any]:
    async with open_channel(address) as channel:
        yield scheduler_pb2_grpc.SchedulerStub(channel)


async def test_a_full_filesystem_refuses_the_grant_naming_the_store_then_recovers(
    small_fs: SmallFs,
) -> None:
    path = small_fs.path / "state.db"
    async with (
        scheduler_for_tests(groups=["g"], store=str(path)) as sched,
        _stub(sched.address) as stub,
    ):
        lease = await stub.Register(
            pb.RegisterRequest(job="a", group="g", lease_seconds=60), timeout=10
        )
        acquire = pb.AcquireRequest(
            job="a", group="g", lease_id=lease.lease_id, secret=lease.secret
        )
        assert small_fs.fill() >= 0
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Acquire(acquire, timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        details = refused.value.details() or ""
        assert "store: sqlite" in details
        assert str(path) in details
        assert "full" in details
        status = await sched.group("g")
        assert status.holder == ""
        assert list(status.queue) == []
        assert _metric(sched, "rlslice_scheduler_store_refusals_total") >= 1
        assert _metric(sched, "rlslice_scheduler_store_healthy") == 0
        small_fs.free()
        grant = await stub.Acquire(acquire, timeout=10)
        assert grant.epoch > 0
        assert _metric(sched, "rlslice_scheduler_store_healthy") == 1
    async with scheduler_for_tests(store=str(path)) as again:
        status = await again.group("g")
        assert status.holder == "a"
        assert status.epoch == grant.epoch


async def test_a_full_filesystem_holds_a_handover_until_space_is_back(
    small_fs: SmallFs,
) -> None:
    path = small_fs.path / "state.db"
    async with (
        scheduler_for_tests(groups=["g"], store=str(path)) as sched,
        _stub(sched.address) as stub,
    ):
        lease = await stub.Register(
            pb.RegisterRequest(job="a", group="g", lease_seconds=60), timeout=10
        )
        held = await stub.Acquire(
            pb.AcquireRequest(job="a", group="g", lease_id=lease.lease_id, secret=lease.secret),
            timeout=10,
        )
        async with AsyncClient(job="b", group="g", scheduler=sched.address) as b:
            waiting = asyncio.ensure_future(b.acquire(timeout=60))
            await eventually(lambda: _queued(sched, "b"))
            small_fs.fill()
            yield_ = pb.YieldRequest(
                job="a", group="g", lease_id=lease.lease_id, secret=lease.secret
            )
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Yield(yield_, timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "store: sqlite" in (refused.value.details() or "")
            status = await sched.group("g")
            assert status.holder == "a"
            assert list(status.queue) == ["b"]
            assert not waiting.done()
            small_fs.free()
            await stub.Yield(yield_, timeout=10)
            grant = await asyncio.wait_for(waiting, 30)
            assert grant.epoch > held.epoch
            await b.yield_()


async def _queued(sched: TestScheduler, job: str) -> bool:
    return job in (await sched.group("g")).queue


_WRITER = """
import sys
from rlslice.config import GroupSpec
from rlslice.scheduler.core import new_group
from rlslice.scheduler.store import SQLiteStore
store = SQLiteStore(sys.argv[1])
state = new_group(GroupSpec(name="g"))
epoch = 0
while True:
    epoch += 1
    state = state.__class__(**{**{f: getattr(state, f) for f in state.__slots__}, "epoch": epoch})
    store.save_group(state)  # no event loop: written and committed before it returns
    store.commit_now("g")
    print(epoch, flush=True)
"""


@pytest.mark.parametrize("after", [1, 9, 60])
def test_a_process_killed_while_it_writes_leaves_a_sound_store_with_every_commit(
    tmp_path: Path, after: int
) -> None:
    path = tmp_path / "state.db"
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(path)],
        stdout=subprocess.PIPE,
        env=child_env(),
        text=True,
    )
    assert writer.stdout is not None
    seen = 0
    try:
        while seen < after:
            seen = int(writer.stdout.readline())
        os.kill(writer.pid, signal.SIGKILL)  # while it writes the next ones
    finally:
        writer.kill()
        writer.wait(10)
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    loaded = asyncio.run(SQLiteStore(path).load())
    assert loaded.groups["g"].epoch >= seen
