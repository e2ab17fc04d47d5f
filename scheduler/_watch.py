"""Watch fan-out: every group's watchers and the all-groups watchers, each an asyncio
queue fed without blocking (a watcher too far behind gets the end marker instead)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from rlslice.scheduler._runtime import EventEntry, GroupRuntime

Queue = asyncio.Queue[EventEntry | None]


class WatchHub:
    """Queues of events: per group (in the group's runtime) and for every group."""

    def __init__(self, queue_size: int) -> None:
        self._queue_size = queue_size
        self._everywhere: set[Queue] = set()

    def watch(self, runtime: GroupRuntime | None) -> Queue:
        """A new queue of `runtime`'s events (None: of every group's)."""
        queue: Queue = asyncio.Queue(self._queue_size)
        (runtime.watchers if runtime is not None else self._everywhere).add(queue)
        return queue

    def unwatch(self, runtime: GroupRuntime | None, queue: Queue) -> None:
        """Stop delivering to `queue`."""
        if runtime is not None:
            runtime.watchers.discard(queue)
        self._everywhere.discard(queue)

    def wanted(self, runtime: GroupRuntime) -> bool:
        """Whether anyone watches `runtime`'s events (so building an entry is worth it)."""
        return bool(runtime.watchers or self._everywhere)

    def publish(self, runtime: GroupRuntime, entry: EventEntry) -> None:
        """Deliver `entry` to the group's watchers and to every-group watchers."""
        for queue in runtime.watchers:
            offer(queue, entry)
        for queue in self._everywhere:
            offer(queue, entry)

    def end(self, runtime: GroupRuntime) -> None:
        """The group is gone: its watchers get the end marker."""
        for queue in runtime.watchers:
            offer(queue, None)

    def close(self, runtimes: Iterable[GroupRuntime]) -> None:
        """Shutting down: every watcher gets the end marker."""
        for runtime in runtimes:
            self.end(runtime)
        for queue in self._everywhere:
            offer(queue, None)


def offer(queue: Queue, entry: EventEntry | None) -> None:
    """Deliver without blocking; a watcher too far behind gets the end marker instead."""
    try:
        queue.put_nowait(entry)
    except asyncio.QueueFull:
        while not queue.empty():
            queue.get_nowait()
        queue.put_nowait(None)
