"""`@gpu_phase("rollout")`: hold the job's group for each call of an actor method.

```python
import ray
from rlslice.integrations.ray import gpu_phase

@ray.remote(num_gpus=1, runtime_env={"env_vars": {
    "RLSLICE_SCHEDULER": "10.0.0.5:50551", "RLSLICE_JOB": "grpo-7b", "RLSLICE_GROUP": "gpus-a"}})
class Rollout:
    @gpu_phase("rollout")
    def generate(self, prompts):
        return self.engine.generate(prompts)
```

Each Ray actor is its own process: the first decorated call in a process builds one client
from that process's `RLSLICE_*` environment (Ray passes it through `runtime_env`), and every
decorated method there shares it, so the process registers once per group and nested or
concurrent calls share one hold (the first in acquires, the last out yields). Plain methods
use a `Client`; `async def` methods an `AsyncClient` on the actor's event loop; generator
methods (Ray's streaming returns) hold the group until the generator is exhausted or closed.

`client=` takes a factory (a zero-argument callable returning a `Client` or `AsyncClient`,
called once per process) or, outside Ray, a client itself. A client cannot be pickled:
under Ray pass a factory, or nothing. Ray itself is not imported here; the decorator works
on any class (most tests use plain classes; `tests/integrations/test_ray_actors.py` runs
real actors on a local Ray cluster).

Ray inspects what it wraps: the wrapper keeps the method's name, docstring, signature
(`__wrapped__`) and kind (`inspect.iscoroutinefunction` stays true for `async def`), and
attributes set by `@ray.method(...)` applied beneath it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any, TypeVar, cast

from rlslice._errors import InvalidArgumentError
from rlslice._ids import validate_id
from rlslice.client import AsyncClient, Client, validate_phase
from rlslice.integrations._clients import (
    ClientSource,
    aclose_process_clients,
    async_client,
    close_process_clients,
    sync_client,
)

__all__ = [
    "ClientSource",
    "aclose_process_clients",
    "close_process_clients",
    "gpu_phase",
    "process_async_client",
    "process_client",
]

F = TypeVar("F", bound=Callable[..., Any])


def process_client() -> Client:
    """The `Client` this process builds from its `RLSLICE_*` environment (the one
    `@gpu_phase` uses for plain methods), for phases written by hand."""
    return sync_client(None)


def process_async_client() -> AsyncClient:
    """The `AsyncClient` of this process and its running loop, from the environment."""
    return async_client(None)


def gpu_phase(
    name: str,
    group: str | None = None,
    *,
    groups: Iterable[str] | None = None,
    client: ClientSource = None,
) -> Callable[[F], F]:
    """Hold `group` (the client's default group when None) for every call of the decorated
    function; `groups=[...]` instead holds several at once (a multi-group phase, entered in
    canonical order: weight sync between a trainer pool and a sampler pool).

    The name and ids are checked here, when the class is defined; the client is built at
    the first call, in the process that makes it.
    """
    validate_phase(name)
    if group is not None:
        validate_id(group, "group")
    listed = _groups(groups, group)

    def decorate(function: F) -> F:
        is_async = inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function)
        if is_async and isinstance(client, Client):
            raise TypeError(f"{function.__qualname__}: an async function needs an AsyncClient")
        if not is_async and isinstance(client, AsyncClient):
            raise TypeError(f"{function.__qualname__}: a plain function needs a Client")
        if inspect.isasyncgenfunction(function):
            return cast(F, _async_generator(function, name, group, listed, client))
        if inspect.iscoroutinefunction(function):
            return cast(F, _coroutine(function, name, group, listed, client))
        if inspect.isgeneratorfunction(function):
            return cast(F, _generator(function, name, group, listed, client))
        return cast(F, _plain(function, name, group, listed, client))

    return decorate


def _groups(groups: Iterable[str] | None, group: str | None) -> tuple[str, ...] | None:
    if groups is None:
        return None
    if group is not None:
        raise InvalidArgumentError("groups: give group= or groups=, not both")
    if isinstance(groups, str | bytes):
        raise InvalidArgumentError("groups: must be a list of group ids (not a single string)")
    listed = tuple(validate_id(g, f"groups[{i}]") for i, g in enumerate(groups))
    if not listed:
        raise InvalidArgumentError("groups: must name at least one group")
    return listed


def _phase(client: Any, name: str, group: str | None, groups: tuple[str, ...] | None) -> Any:
    # Both clients' phase objects are context managers (sync or async) and share holds.
    if groups is not None:
        return client.phase(name, groups=groups)
    return client.phase(name, group)


def _plain(
    function: Callable[..., Any],
    name: str,
    group: str | None,
    groups: tuple[str, ...] | None,
    source: ClientSource,
) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _phase(sync_client(source), name, group, groups):
            return function(*args, **kwargs)

    return wrapper


def _generator(
    function: Callable[..., Iterator[Any]],
    name: str,
    group: str | None,
    groups: tuple[str, ...] | None,
    source: ClientSource,
) -> Callable[..., Iterator[Any]]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Iterator[Any]:
        with _phase(sync_client(source), name, group, groups):
            return (yield from function(*args, **kwargs))

    return wrapper


def _coroutine(
    function: Callable[..., Any],
    name: str,
    group: str | None,
    groups: tuple[str, ...] | None,
    source: ClientSource,
) -> Callable[..., Any]:
    @functools.wraps(function)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        async with _phase(async_client(source), name, group, groups):
            return await function(*args, **kwargs)

    return wrapper


def _async_generator(
    function: Callable[..., AsyncIterator[Any]],
    name: str,
    group: str | None,
    groups: tuple[str, ...] | None,
    source: ClientSource,
) -> Callable[..., AsyncIterator[Any]]:
    @functools.wraps(function)
    async def wrapper(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async with _phase(async_client(source), name, group, groups):
            async for item in function(*args, **kwargs):
                yield item

    return wrapper
