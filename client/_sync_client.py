"""`Client`: the blocking face of `AsyncClient`, for plain training loops.

Every call runs the `AsyncClient` method of the same name on a private event loop in a
daemon thread and blocks on its result; no logic is repeated here. Calls may come from
several threads at once: they all land on the one loop, which serialises the client's state.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
from collections.abc import Awaitable, Callable, Iterable
from types import TracebackType
from typing import TypeVar, overload

from rlslice._errors import FailedPreconditionError
from rlslice.client._async_client import AsyncClient
from rlslice.client._leases import YieldRequestedCallback
from rlslice.client._loop_thread import LoopThread
from rlslice.client._phase import SyncGroupsPhase, SyncPhase, canonical_groups, validate_phase
from rlslice.client._results import Grant, YieldResult
from rlslice.config import TLSConfig

T = TypeVar("T")


class Client:
    """A job's handle on the scheduler, for blocking code. Same arguments as `AsyncClient`.

    >>> client = Client(job="grpo-7b", group="gpus-a")        # doctest: +SKIP
    >>> with client.phase("train"):                            # doctest: +SKIP
    ...     train_step()

    A sync `on_yield_requested(group, preempt_in_seconds)` callback runs on a worker thread,
    so it may call this client (to yield, say).
    """

    def __init__(
        self,
        job: str | None = None,
        group: str | None = None,
        scheduler: str | None = None,
        lease_seconds: float | None = None,
        token: str | None = None,
        tls: TLSConfig | None = None,
        priority: int | None = None,
        weight: float | None = None,
        *,
        device_bytes: int | None = None,
        on_yield_requested: YieldRequestedCallback | None = None,
    ) -> None:
        callback = _off_loop(on_yield_requested) if on_yield_requested is not None else None
        self._async = AsyncClient(
            job,
            group,
            scheduler,
            lease_seconds,
            token,
            tls,
            priority,
            weight,
            device_bytes=device_bytes,
            on_yield_requested=callback,
        )
        self._thread: LoopThread | None = None
        self._thread_lock = threading.Lock()

    def _run(self, make: Callable[[AsyncClient], Awaitable[T]]) -> T:
        if self._async.closed:
            raise FailedPreconditionError("client: closed")
        with self._thread_lock:
            if self._thread is None:
                self._thread = LoopThread(name=f"rlslice-client-{self._async.job or 'disabled'}")
            thread = self._thread
        try:
            return thread.run(lambda: make(self._async))
        except (asyncio.CancelledError, concurrent.futures.CancelledError):
            # close() from another thread stops the loop under a blocked call: the caller
            # sees the same error as a call made after close, not a bare cancellation.
            if self._async.closed:
                raise FailedPreconditionError("client: closed") from None
            raise

    @property
    def job(self) -> str:
        """The job id ("" for a disabled client given none)."""
        return self._async.job

    @property
    def group(self) -> str | None:
        """The default group, used by calls that name none."""
        return self._async.group

    @property
    def scheduler(self) -> str | None:
        """The scheduler's address, or None for a disabled client."""
        return self._async.scheduler

    @property
    def disabled(self) -> bool:
        """True when no scheduler is configured and every call passes through."""
        return self._async.disabled

    def yield_requested(self, group: str | None = None) -> bool:
        """Whether the scheduler asks this job to yield `group`; see `AsyncClient`."""
        return self._async.yield_requested(group)

    def wait_yield_requested(self, group: str | None = None, timeout: float | None = None) -> bool:
        """Block until the scheduler asks this job to yield `group`; False after `timeout`."""
        return self._run(lambda c: c.wait_yield_requested(group, timeout))

    def acquire(
        self, timeout: float | None = None, group: str | None = None, phase: str = ""
    ) -> Grant:
        """Block until the job holds `group`; see `AsyncClient.acquire`."""
        return self._run(lambda c: c.acquire(timeout, group, phase))

    def yield_(self, group: str | None = None) -> YieldResult:
        """Give `group` up; see `AsyncClient.yield_`."""
        return self._run(lambda c: c.yield_(group))

    @overload
    def phase(self, name: str, group: str | None = None) -> SyncPhase: ...

    @overload
    def phase(self, name: str, group: None = None, *, groups: Iterable[str]) -> SyncGroupsPhase: ...

    def phase(
        self, name: str, group: str | None = None, *, groups: Iterable[str] | None = None
    ) -> SyncPhase | SyncGroupsPhase:
        """Hold `group` for a block: `with client.phase("train"):` or `@client.phase("train")`.

        `groups=[...]` holds several groups, acquired in sorted order and yielded in
        reverse; the `as` value is a `dict[str, Grant]`. See `AsyncClient.phase`.
        """
        validate_phase(name)  # before the groups, as AsyncClient.phase does
        if groups is None:
            return SyncPhase(self, self._async.phase(name, group))
        return SyncGroupsPhase(
            self, self._async.phase(name, groups=canonical_groups(groups, group))
        )

    def close(self, *, bring_home: bool = False, timeout: float = 60.0) -> None:
        """Give up every lock, leave every queue, stop the keep-alives and the loop thread.

        As `AsyncClient.close`: with `bring_home=True` the job first brings its parked
        state home (waiting up to `timeout` seconds for its turn)."""
        with self._thread_lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            try:
                thread.run(lambda: self._async.close(bring_home=bring_home, timeout=timeout))
            finally:
                thread.stop()
        else:  # never used: no lease, no channel, nothing to release
            self._async.mark_closed()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return repr(self._async).replace("AsyncClient", "Client", 1)


def _off_loop(callback: YieldRequestedCallback) -> YieldRequestedCallback:
    """Run a sync callback on a worker thread so it may block on the client."""
    if inspect.iscoroutinefunction(callback):
        return callback

    async def call(group: str, preempt_in: float) -> object:
        return await asyncio.to_thread(callback, group, preempt_in)

    return call
