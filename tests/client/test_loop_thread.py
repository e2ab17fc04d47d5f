"""The private loop thread behind the sync Client.

Cases: a result comes back; an exception comes back as itself; several threads may call
at once; a call from the loop's own thread is refused (it would deadlock); an interrupted
caller cancels its coroutine on the loop before returning; stop() cancels what still runs.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Iterator

import pytest

from rlslice.client._loop_thread import LoopThread


@pytest.fixture
def loop_thread() -> Iterator[LoopThread]:
    thread = LoopThread("test-loop")
    yield thread
    thread.stop()


def test_a_result_comes_back(loop_thread: LoopThread) -> None:
    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    assert loop_thread.run(answer) == 42


def test_an_exception_comes_back_as_itself(loop_thread: LoopThread) -> None:
    async def fail() -> None:
        raise LookupError("group: 'x' not found")

    with pytest.raises(LookupError, match="group: 'x'"):
        loop_thread.run(fail)


def test_several_threads_may_call_at_once(loop_thread: LoopThread) -> None:
    barrier = asyncio.Event()
    results: list[int] = []

    async def wait_then(n: int) -> int:
        if n == 3:
            barrier.set()
        await asyncio.wait_for(barrier.wait(), 5)
        return n

    threads = [
        threading.Thread(target=lambda n=n: results.append(loop_thread.run(lambda: wait_then(n))))
        for n in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(results) == [0, 1, 2, 3]


def test_a_call_from_the_loop_thread_is_refused(loop_thread: LoopThread) -> None:
    async def reenter() -> None:
        loop_thread.run(lambda: asyncio.sleep(0))

    with pytest.raises(RuntimeError, match="own loop thread"):
        loop_thread.run(reenter)


def test_an_interrupted_caller_cancels_its_coroutine(loop_thread: LoopThread) -> None:
    cancelled = threading.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGUSR1, interrupt)
    timer = threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGUSR1))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            loop_thread.run(forever)
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, previous)
    assert cancelled.is_set()  # already, not eventually: run() waited for it


def test_stop_cancels_what_still_runs() -> None:
    thread = LoopThread("test-stop")
    started, cancelled = threading.Event(), threading.Event()

    async def forever() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    asyncio.run_coroutine_threadsafe(forever(), thread.loop)
    assert started.wait(5)
    thread.stop()
    assert cancelled.is_set()
    with pytest.raises(RuntimeError, match="stopped"):
        thread.run(forever)
