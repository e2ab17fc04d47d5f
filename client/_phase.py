"""`client.phase(name)`: hold a group for a block of code, as a context manager or decorator.

Phases of one client nest and overlap per group: the first to enter acquires, the last to
leave yields, so a job's threads or tasks share the lock the job holds. The logic lives in
`AsyncClient`; these objects only adapt it to `with`, `async with` and decorators.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Coroutine
from types import TracebackType
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from rlslice._errors import InvalidArgumentError
from rlslice.client._results import Grant

if TYPE_CHECKING:
    from rlslice.client._async_client import AsyncClient
    from rlslice.client._sync_client import Client

P = ParamSpec("P")
R = TypeVar("R")

MAX_PHASE_LENGTH = 63


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


class AsyncPhase:
    """`async with client.phase("train") as grant:` or `@client.phase("train")` on an async def."""

    def __init__(self, client: AsyncClient, name: str, group: str) -> None:
        self._client = client
        self.name = name
        self.group = group

    async def __aenter__(self) -> Grant:
        return await self._client._enter_phase(self.name, self.group)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._client._exit_phase(self.group)

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


class SyncPhase:
    """`with client.phase("train") as grant:` or `@client.phase("train")` on a plain def."""

    def __init__(self, client: Client, name: str, group: str) -> None:
        self._client = client
        self.name = name
        self.group = group

    def _run(self, make: Callable[[AsyncClient], Awaitable[R]]) -> R:
        return self._client._run(make)

    def __enter__(self) -> Grant:
        return self._run(lambda c: c._enter_phase(self.name, self.group))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._run(lambda c: c._exit_phase(self.group))

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
