"""`serve_until_signal`: the one main loop of the server commands.

Cases:
- SIGTERM (or SIGINT) after the start stops what was started, and the handlers go again;
- a signal that comes while the server starts still stops it once it is up;
- with `until` given, setting it stops the server and no signal handler is installed;
- an error from `start` propagates and nothing is stopped.
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from rlslice.adapters.server import serve_until_signal


class Server:
    def __init__(self) -> None:
        self.stopped = 0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_a_signal_after_the_start_stops_the_server(signum: signal.Signals) -> None:
    server = Server()
    seen: list[Server] = []
    before = signal.getsignal(signum)

    async def start() -> Server:
        return server

    async def stop(running: Server) -> None:
        running.stopped += 1

    def started(running: Server) -> None:
        seen.append(running)
        os.kill(os.getpid(), signum)

    await asyncio.wait_for(serve_until_signal(start, stop, started=started), timeout=10)
    assert seen == [server]
    assert server.stopped == 1
    assert signal.getsignal(signum) == before


async def test_a_signal_during_the_start_stops_the_server_once_it_is_up() -> None:
    server = Server()

    async def start() -> Server:
        os.kill(os.getpid(), signal.SIGTERM)  # handled: the handlers are in already
        await asyncio.sleep(0)
        return server

    async def stop(running: Server) -> None:
        running.stopped += 1

    await asyncio.wait_for(serve_until_signal(start, stop), timeout=10)
    assert server.stopped == 1


async def test_an_until_event_stops_the_server_without_signal_handlers() -> None:
    server = Server()
    until = asyncio.Event()
    handlers: list[object] = []
    before = signal.getsignal(signal.SIGTERM)

    async def start() -> Server:
        return server

    async def stop(running: Server) -> None:
        running.stopped += 1

    def started(_: Server) -> None:
        handlers.append(signal.getsignal(signal.SIGTERM))
        until.set()

    await asyncio.wait_for(serve_until_signal(start, stop, started=started, until=until), 10)
    assert server.stopped == 1
    assert handlers == [before]


async def test_an_error_from_the_start_propagates_and_nothing_is_stopped() -> None:
    stopped: list[object] = []

    async def start() -> Server:
        raise OSError("address in use")

    async def stop(running: Server) -> None:
        stopped.append(running)

    with pytest.raises(OSError, match="address in use"):
        await serve_until_signal(start, stop)
    assert stopped == []
