"""The sync Client against a real scheduler running on a background thread.

Cases:
- `with client.phase(...)` and `@client.phase(...)` hold the group, then yield;
- two clients in two threads contend: B blocks until A yields;
- one client shared by several threads: their phases share one hold;
- an acquire that times out raises DeadlineExceededError and leaves no waiter;
- a KeyboardInterrupt-style interruption of a blocked acquire cancels it on the server;
- close() releases the lock; a closed client refuses calls;
- close() from another thread ends a blocked acquire with FailedPreconditionError;
- a sync on_yield_requested callback runs off the loop and may call the client.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from rlslice._errors import DeadlineExceededError, FailedPreconditionError
from rlslice.client import Client
from rlslice.config import GroupSpec
from rlslice.testing import SchedulerForTests
from rlslice.v1alpha1 import scheduler_pb2 as pb


@pytest.fixture
def sched() -> Iterator[SchedulerForTests]:
    with SchedulerForTests(groups=["gpus"]) as running:
        yield running


def wait_for(
    sched: SchedulerForTests, check: Callable[[pb.GroupStatus], bool], timeout: float = 5.0
) -> pb.GroupStatus:
    give_up = time.monotonic() + timeout
    while True:
        status = sched.group("gpus")
        if check(status) or time.monotonic() > give_up:
            assert check(status), f"condition never held; last status:\n{status}"
            return status
        time.sleep(0.02)


def test_phases_hold_the_group_as_blocks_and_decorators(sched: SchedulerForTests) -> None:
    with Client(job="a", group="gpus", scheduler=sched.address) as client:

        @client.phase("rollout")
        def rollout() -> str:
            return sched.group("gpus").holder

        with client.phase("train") as grant:
            assert grant.job == "a"
            assert sched.group("gpus").holder == "a"
        assert sched.group("gpus").holder == ""
        assert rollout() == "a"
        assert sched.group("gpus").holder == ""


def test_b_blocks_until_a_yields_across_threads(sched: SchedulerForTests) -> None:
    a = Client(job="a", group="gpus", scheduler=sched.address)
    b = Client(job="b", group="gpus", scheduler=sched.address)
    a.acquire()
    granted: list[str] = []
    waiter = threading.Thread(target=lambda: granted.append(b.acquire().job))
    waiter.start()
    wait_for(sched, lambda s: list(s.queue) == ["b"])
    assert granted == []
    assert a.yield_().waiters == 1
    waiter.join(5)
    assert granted == ["b"]
    a.close()
    b.close()


def test_threads_sharing_a_client_share_its_hold(sched: SchedulerForTests) -> None:
    with Client(job="a", group="gpus", scheduler=sched.address) as client:
        inside = threading.Barrier(4)
        epochs: list[int] = []

        def work() -> None:
            with client.phase("train") as grant:
                epochs.append(grant.epoch)
                inside.wait(5)  # all four are inside the phase at once

        threads = [threading.Thread(target=work) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert len(set(epochs)) == 1
        assert len(epochs) == 4
        status = sched.group("gpus")
        assert (status.holder, status.epoch) == ("", epochs[0])


def test_a_timed_out_acquire_leaves_no_waiter(sched: SchedulerForTests) -> None:
    with (
        Client(job="a", group="gpus", scheduler=sched.address) as a,
        Client(job="b", group="gpus", scheduler=sched.address) as b,
    ):
        a.acquire()
        with pytest.raises(DeadlineExceededError):
            b.acquire(timeout=0.2)
        assert wait_for(sched, lambda s: len(s.queue) == 0).holder == "a"


def test_an_interrupted_acquire_is_cancelled_on_the_server(sched: SchedulerForTests) -> None:
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    with (
        Client(job="a", group="gpus", scheduler=sched.address) as a,
        Client(job="b", group="gpus", scheduler=sched.address) as b,
    ):
        a.acquire()
        previous = signal.signal(signal.SIGUSR1, interrupt)
        timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1))
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                b.acquire()  # Ctrl-C while blocked
        finally:
            timer.cancel()
            signal.signal(signal.SIGUSR1, previous)
        assert wait_for(sched, lambda s: len(s.queue) == 0).holder == "a"


def test_close_releases_the_lock_and_a_closed_client_refuses_calls(
    sched: SchedulerForTests,
) -> None:
    client = Client(job="a", group="gpus", scheduler=sched.address)
    client.acquire()
    client.close()
    status = sched.group("gpus")
    assert status.holder == ""
    assert len(status.jobs) == 0
    with pytest.raises(FailedPreconditionError, match=r"^client: closed"):
        client.acquire()


def test_closing_from_another_thread_ends_a_blocked_acquire(sched: SchedulerForTests) -> None:
    with Client(job="a", group="gpus", scheduler=sched.address) as a:
        a.acquire()
        b = Client(job="b", group="gpus", scheduler=sched.address)
        outcome: list[BaseException] = []

        def blocked() -> None:
            try:
                b.acquire()
            except BaseException as error:
                outcome.append(error)

        waiter = threading.Thread(target=blocked)
        waiter.start()
        wait_for(sched, lambda s: list(s.queue) == ["b"])
        b.close()
        waiter.join(5)
        assert len(outcome) == 1
        assert isinstance(outcome[0], FailedPreconditionError)
        assert wait_for(sched, lambda s: len(s.queue) == 0).holder == "a"


def test_a_sync_callback_may_yield_from_inside() -> None:
    spec = GroupSpec(name="gpus", max_hold_seconds=0.5, yield_grace_seconds=30)
    with SchedulerForTests(groups=[spec]) as sched:
        yielded = threading.Event()
        holder: list[Client] = []

        def on_yield_requested(group: str, preempt_in: float) -> None:
            holder[0].yield_(group)
            yielded.set()

        a = Client(
            job="a",
            group="gpus",
            scheduler=sched.address,
            lease_seconds=1,
            on_yield_requested=on_yield_requested,
        )
        holder.append(a)
        with Client(job="b", group="gpus", scheduler=sched.address) as b:
            a.acquire()
            assert b.acquire(timeout=10).job == "b"
            assert yielded.wait(5)
        a.close()
