"""`client.phase(name)`: hold a group for a block of code, as a context manager or decorator.

Phases of one client nest and overlap per group: the first to enter acquires, the last to
leave yields, so a job's threads or tasks share the lock the job holds. The logic lives in
`AsyncClient`; these objects only adapt it to `with`, `async with` and decorators.

`client.phase(name, groups=[...])` holds several groups for one block. They are entered in
one canonical order (sorted by id) whatever order the caller lists, so two jobs that need
the same groups can never each hold one and wait for the other.

A phase whose lock was lost meanwhile (its lease lapsed: a partition, a stall) raises
`LockLostError` at the job's next call under it (a nested phase) or at its exit.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Coroutine, Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from rlslice._errors import InvalidArgumentError, LockLostError
from rlslice._ids import validate_id
from rlslice.client._results import Grant

if TYPE_CHECKING:
    from rlslice.client._async_client import AsyncClient
    from rlslice.client._sync_client import Client

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

MAX_PHASE_LENGTH = 63
#: Seconds a phase ending past its lease deadline (no renewal answered) tries its Yield
#: before it reports the lock lost.
LAPSED_YIELD_SECONDS = 2.0


def lock_lost(job: str, group: str, grant: Grant | None, why: str) -> LockLostError:
    """The error a phase raises when the lock it was granted is gone."""
    epoch = grant.epoch if grant is not None else 0
    return LockLostError(
        f"group: job {job!r} lost the lock of group {group!r} granted at epoch {epoch} during "
        f"its phase ({why}); its GPU work was fenced before anyone else was granted: do not "
        "commit what it did since, acquire again to resume",
        group=group,
        job=job,
        epoch=epoch,
    )


def validate_phase(name: object) -> str:
    """A phase name is free text for timelines: printable, at most 63 characters."""
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError("phase: must be a non-empty string")
    if len(name) > MAX_PHASE_LENGTH or not name.isprintable():
        raise InvalidArgumentError(
            f"phase: {name[:MAX_PHASE_LENGTH]!r}... must be printable and at most "
            f"{MAX_PHASE_LENGTH} characters"
        )
    return name


def canonical_groups(groups: object, group: object = None) -> tuple[str, ...]:
    """The groups of a multi-group phase, validated, in the order they are entered (sorted).

    `group` is the single-group argument of the same call: both at once is refused.
    """
    if group is not None:
        raise InvalidArgumentError("groups: give group= or groups=, not both")
    if isinstance(groups, str | bytes) or not isinstance(groups, Iterable):
        raise InvalidArgumentError("groups: must be a list of group ids (not a single string)")
    listed = [validate_id(g, f"groups[{i}]") for i, g in enumerate(groups)]
    if not listed:
        raise InvalidArgumentError("groups: must name at least one group")
    seen: set[str] = set()
    for g in listed:
        if g in seen:
            raise InvalidArgumentError(f"groups: {g!r} is listed twice")
        seen.add(g)
    return tuple(sorted(listed))


class _AsyncBlock(Generic[T]):
    """An `async with` block that also decorates async functions; `T` is its `as` value."""

    async def __aenter__(self) -> T:
        raise NotImplementedError

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        raise NotImplementedError

    def __call__(
        self, function: Callable[P, Coroutine[Any, Any, R]]
    ) -> Callable[P, Coroutine[Any, Any, R]]:
        if not inspect.iscoroutinefunction(function):
            raise TypeError(
                "AsyncClient.phase decorates async functions; use rlslice.Client for plain ones"
            )

        @functools.wraps(function)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            async with self:
                return await function(*args, **kwargs)

        return wrapper


class _SyncBlock(Generic[T]):
    """A `with` block that also decorates plain functions: its async twin (`block`), run on
    the sync client's loop thread; `T` is its `as` value."""

    def __init__(self, client: Client, block: _AsyncBlock[T]) -> None:
        self._client = client
        self._block = block

    def __enter__(self) -> T:
        return self._client._run(lambda _: self._block.__aenter__())

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._client._run(lambda _: self._block.__aexit__(exc_type, exc, tb))

    def __call__(self, function: Callable[P, R]) -> Callable[P, R]:
        if inspect.iscoroutinefunction(function):
            raise TypeError(
                "Client.phase decorates plain functions; use AsyncClient for async ones"
            )

        @functools.wraps(function)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            with self:
                return function(*args, **kwargs)

        return wrapper


class AsyncPhase(_AsyncBlock[Grant]):
    """`async with client.phase("train") as grant:` or `@client.phase("train")` on an async def.

    Keep the object to ask it, inside the block, whether to end the phase early
    (`should_yield()`, `await wait_should_yield()`): see docs/client.md, "Early yield"."""

    def __init__(self, client: AsyncClient, name: str, group: str) -> None:
        self._client = client
        self.name = name
        self.group = group

    def should_yield(self) -> bool:
        """Whether the scheduler asks the job to yield this phase's group now: a `rollout`
        while a `train` waits (early yield), or a hold past `max_hold_seconds`. End the
        phase at the next safe point (a step boundary). Known as of the last KeepAlive."""
        return self._client.yield_requested(self.group)

    async def wait_should_yield(self, timeout: float | None = None) -> bool:
        """Wait until `should_yield()` turns true; False when `timeout` seconds pass first."""
        return await self._client.wait_yield_requested(self.group, timeout)

    async def __aenter__(self) -> Grant:
        return await self._client._enter_phase(self.name, self.group)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._client._exit_phase(self.group)


class SyncPhase(_SyncBlock[Grant]):
    """`with client.phase("train") as grant:` or `@client.phase("train")` on a plain def."""

    def __init__(self, client: Client, phase: AsyncPhase) -> None:
        super().__init__(client, phase)
        self.name = phase.name
        self.group = phase.group

    def should_yield(self) -> bool:
        """Whether the scheduler asks the job to yield this phase's group now; see
        `AsyncPhase.should_yield`."""
        return self._client.yield_requested(self.group)

    def wait_should_yield(self, timeout: float | None = None) -> bool:
        """Block until `should_yield()` turns true; False when `timeout` seconds pass first."""
        return self._client.wait_yield_requested(self.group, timeout)


class AsyncGroupsPhase(_AsyncBlock[dict[str, Grant]]):
    """`async with client.phase("sync", groups=[...]) as grants:` or as a decorator.

    The `as` value is a `dict[str, Grant]` keyed by group, in the order entered (sorted).
    """

    def __init__(self, client: AsyncClient, name: str, groups: tuple[str, ...]) -> None:
        self._client = client
        self.name = name
        self.groups = groups
        """The groups, in the order they are entered (sorted); left in reverse."""

    async def __aenter__(self) -> dict[str, Grant]:
        return await self._client._enter_phases(self.name, self.groups)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._client._exit_phases(self.groups)


class SyncGroupsPhase(_SyncBlock[dict[str, Grant]]):
    """`with client.phase("sync", groups=[...]) as grants:` or as a decorator.

    The `as` value is a `dict[str, Grant]` keyed by group, in the order entered (sorted).
    """

    def __init__(self, client: Client, phase: AsyncGroupsPhase) -> None:
        super().__init__(client, phase)
        self.name = phase.name
        self.groups = phase.groups
        """The groups, in the order they are entered (sorted); left in reverse."""
