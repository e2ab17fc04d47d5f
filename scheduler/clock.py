"""The scheduler's one clock: the running loop's time, shifted once to Unix time.

State holds Unix times (lease deadlines, hold starts) because the store keeps them across
restarts; timers run on the loop (`loop.call_at`). Reading both from one source means a
timer set for a deadline fires exactly when the state says the deadline is due, and a test
that fakes the loop's time (`looptime`) moves the scheduler's whole notion of time with it.
"""

from __future__ import annotations

import asyncio
import time


class LoopClock:
    """`now()` is `loop.time() + offset`, the offset (`time.time() - loop.time()`) taken
    once, at `start` or at the first reading on a running loop."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._offset = 0.0

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Bind to `loop` (default: the running one) and take the offset. Binding again to
        the same loop keeps the first offset, so times already handed out stay consistent."""
        loop = loop if loop is not None else asyncio.get_running_loop()
        if loop is self._loop:
            return
        self._loop = loop
        self._offset = time.time() - loop.time()

    def now(self) -> float:
        """Unix seconds, as the loop counts them."""
        loop = self._loop
        if loop is None or loop.is_closed():
            self.start()
            loop = self._loop
            assert loop is not None
        return loop.time() + self._offset

    __call__ = now

    def loop_time(self, at: float) -> float:
        """The loop time of Unix time `at` (for `loop.call_at`)."""
        if self._loop is None:
            self.start()
        return at - self._offset
