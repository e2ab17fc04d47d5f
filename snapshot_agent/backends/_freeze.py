"""Stop and resume processes with SIGSTOP / SIGCONT, and read their scheduler state.

SIGSTOP is delivered asynchronously: `stop()` waits until /proc shows every process
stopped ('T') before it returns, so nothing writes device memory while it is copied.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterable


def proc_state(pid: int) -> str | None:
    """The one-letter state of `pid` from /proc/<pid>/stat ('R', 'S', 'T', ...), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            text = handle.read().decode(errors="replace")
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the state follows the last ')'.
    return text[text.rfind(")") + 2 :][:1] or None


def _is_stopped_or_gone(pid: int) -> bool:
    return proc_state(pid) in (None, "T", "t", "Z", "X")


async def stop(pids: Iterable[int], *, deadline: float) -> list[int]:
    """SIGSTOP each process, wait until all are stopped; return those signalled.

    Raises TimeoutError past `deadline` (the caller resumes the processes).
    """
    signalled: list[int] = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
            signalled.append(pid)
    # A process takes the signal the next time it is scheduled: tens of microseconds on an
    # idle core. Yield the CPU to it a few times before sleeping on the loop, whose timer
    # (epoll's millisecond) would round the first wait up to a whole millisecond.
    spin_until = time.monotonic() + SPIN_SECONDS
    while not all(_is_stopped_or_gone(pid) for pid in signalled):
        if time.monotonic() > spin_until:
            break
        os.sched_yield()
    else:
        return signalled
    delay = 0.0002
    while not all(_is_stopped_or_gone(pid) for pid in signalled):
        if time.time() > deadline:
            raise TimeoutError("processes did not stop before the deadline")
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.01)
    return signalled


SPIN_SECONDS = 0.0005
"""How long `stop` checks at once (yielding the CPU) before it sleeps between checks: a
process in an uninterruptible wait (a driver call) may take far longer to stop."""


def resume(pids: Iterable[int]) -> None:
    """SIGCONT each process that still exists."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def stopped(pid: int) -> bool:
    """True when `pid` is stopped by a signal."""
    return proc_state(pid) in ("T", "t")
