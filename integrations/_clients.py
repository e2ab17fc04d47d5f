"""One client per process and source, built on first use and rebuilt in a forked child.

Frameworks ship decorated classes to other processes (Ray pickles an actor's class into
each actor process); a client holds threads, sockets and a lease, so it cannot travel. What
travels is its *source*: nothing (build it from the `RLSLICE_*` environment of the process)
or a factory. The first call in a process builds the client and every later call there
shares it, so a process registers once per group (a second client of the same job in the
same group would be refused with ALREADY_EXISTS while the first one's lease lives).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from rlslice._errors import FailedPreconditionError
from rlslice.client import AsyncClient, Client

log = logging.getLogger("rlslice.integrations")

AnyClient = Client | AsyncClient
#: What a decorated method or a callback gets its client from: a client, a factory, or
#: None (a client built from the process's `RLSLICE_*` environment).
ClientSource = Client | AsyncClient | Callable[[], Client | AsyncClient] | None


@dataclass
class _Registry:
    pid: int = field(default_factory=os.getpid)
    sync: dict[object, Client] = field(default_factory=dict)
    asynchronous: dict[object, tuple[AsyncClient, asyncio.AbstractEventLoop]] = field(
        default_factory=dict
    )


_lock = threading.Lock()
_registry = _Registry()


def _current() -> _Registry:
    """The registry of this process; a forked child starts empty (the parent's client
    threads do not exist in the child, and its lease is the parent's)."""
    global _registry
    if _registry.pid != os.getpid():
        _registry = _Registry()
    return _registry


def _key(source: ClientSource) -> object:
    return "environment" if source is None else source


def _describe(source: ClientSource) -> str:
    return "the RLSLICE_* environment" if source is None else f"factory {source!r}"


def sync_client(source: ClientSource) -> Client:
    """The blocking client `source` gives in this process (built once)."""
    if isinstance(source, Client):
        return source
    if isinstance(source, AsyncClient):
        raise TypeError("a plain (non-async) function needs a Client, not an AsyncClient")
    with _lock:
        registry = _current()
        key = _key(source)
        if key in registry.asynchronous:
            raise FailedPreconditionError(
                f"client: this process already has an AsyncClient from {_describe(source)}; "
                "a second client of the job would register twice: decorate async or plain "
                "methods in one process, or pass client= explicitly"
            )
        client = registry.sync.get(key)
        if client is None:
            built = Client() if source is None else source()
            if not isinstance(built, Client):
                raise TypeError(f"client: factory returned {built!r}, expected a Client")
            client = registry.sync[key] = built
        return client


def async_client(source: ClientSource) -> AsyncClient:
    """The asyncio client `source` gives in this process, for the running loop (built once)."""
    if isinstance(source, AsyncClient):
        return source
    if isinstance(source, Client):
        raise TypeError("an async function needs an AsyncClient, not a Client")
    loop = asyncio.get_running_loop()
    with _lock:
        registry = _current()
        key = _key(source)
        if key in registry.sync:
            raise FailedPreconditionError(
                f"client: this process already has a Client from {_describe(source)}; "
                "a second client of the job would register twice: decorate async or plain "
                "methods in one process, or pass client= explicitly"
            )
        entry = registry.asynchronous.get(key)
        if entry is None:
            built = AsyncClient() if source is None else source()
            if not isinstance(built, AsyncClient):
                raise TypeError(f"client: factory returned {built!r}, expected an AsyncClient")
            entry = registry.asynchronous[key] = (built, loop)
        elif entry[1] is not loop:
            # An AsyncClient belongs to the loop of its first call (its channel does).
            raise FailedPreconditionError(
                "client: the process's AsyncClient belongs to another event loop; "
                "pass client= a factory per loop"
            )
        return entry[0]


def close_process_clients() -> None:
    """Close the blocking clients this process built (the groups they hold are yielded,
    their leases end). Async ones are closed by `aclose_process_clients()`."""
    with _lock:
        registry = _current()
        clients, registry.sync = list(registry.sync.values()), {}
    for client in clients:
        try:
            client.close()
        except Exception:
            log.exception("closing the process's rlslice client failed")


async def aclose_process_clients() -> None:
    """Close every client this process built: the async ones of the running loop here, the
    blocking ones in a worker thread."""
    loop = asyncio.get_running_loop()
    with _lock:
        registry = _current()
        mine = [c for c, owner in registry.asynchronous.values() if owner is loop]
        registry.asynchronous = {k: v for k, v in registry.asynchronous.items() if v[1] is not loop}
    for client in mine:
        await client.close()
    await asyncio.to_thread(close_process_clients)


# A process that ends yields at once what it holds, rather than after its lease lapses.
atexit.register(close_process_clients)
