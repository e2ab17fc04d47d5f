"""A private event loop on a daemon thread, so sync code can drive async objects.

Any thread may submit a coroutine and block on its result. Interrupting the wait
(KeyboardInterrupt, say) cancels the coroutine on the loop, which cancels a gRPC call in
flight, so an interrupted acquire leaves no waiter behind.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

#: Seconds an interrupted caller waits for the cancellation to reach the loop.
CANCEL_WAIT = 5.0


class LoopThread:
    """An event loop running forever on its own daemon thread until `stop()`."""

    def __init__(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop (for tests and for scheduling callbacks)."""
        return self._loop

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            pending = asyncio.all_tasks(self._loop)
            for task in pending:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()

    def run(self, make: Callable[[], Awaitable[T]]) -> T:
        """Run the awaitable `make()` returns on the loop; block until it is done."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("a blocking rlslice call made from the client's own loop thread")
        if not self._thread.is_alive():
            raise RuntimeError("the client's loop thread has stopped (the client is closed)")

        finished = threading.Event()

        async def main() -> T:
            try:
                return await make()
            finally:
                finished.set()

        future = asyncio.run_coroutine_threadsafe(main(), self._loop)
        try:
            return future.result()
        except BaseException:
            if not future.done() or future.cancelled():
                future.cancel()
                # Let the cancellation reach the coroutine (and a gRPC call in flight, and
                # so the server) before the caller goes on.
                finished.wait(CANCEL_WAIT)
            raise

    def stop(self) -> None:
        """Stop the loop (cancelling what still runs there) and wait for the thread."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            if threading.current_thread() is not self._thread:
                self._thread.join()
