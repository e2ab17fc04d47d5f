"""The slow-link proxy itself (`delayproxy.DelayProxy`), against an echo server.

- every byte takes the latency each way (a round trip at least twice it), in order;
- chunks sent back to back arrive back to back: 20 of them cross within a few latencies,
  not one latency each;
- a cut holds every byte until the heal, then delivers them, in order;
- a reset cut closes the connection and turns new ones away until the heal.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from .delayproxy import DelayProxy
from .netfault import private_host

LATENCY = 0.2


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1 << 16):
        writer.write(data)
        await writer.drain()
    writer.close()


@pytest.fixture
async def proxy() -> AsyncIterator[DelayProxy]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    port = int(server.sockets[0].getsockname()[1])
    with DelayProxy(private_host(250), ("127.0.0.1", port), LATENCY) as running:
        yield running
    server.close()


async def _read(reader: asyncio.StreamReader, size: int, timeout: float = 10.0) -> bytes:
    return await asyncio.wait_for(reader.readexactly(size), timeout)


async def _closed(reader: asyncio.StreamReader) -> bool:
    """The proxy closed the connection (an end of stream, or a reset)."""
    try:
        return await asyncio.wait_for(reader.read(), 10) == b""
    except ConnectionResetError:
        return True


async def test_every_chunk_takes_the_latency_each_way_in_order(proxy: DelayProxy) -> None:
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection(proxy.host, proxy.port)
    start = loop.time()
    writer.write(b"ping")
    assert await _read(reader, 4) == b"ping"
    assert loop.time() - start >= 2 * LATENCY
    chunks = [bytes([i]) * 1000 for i in range(20)]
    start = loop.time()
    for chunk in chunks:
        writer.write(chunk)
        await writer.drain()
    assert await _read(reader, 20_000) == b"".join(chunks)
    # Pipelined: 20 chunks one latency apart each would take 8 s.
    assert loop.time() - start < 2 * LATENCY + 2.0
    writer.close()


async def test_a_cut_holds_every_byte_until_the_heal(proxy: DelayProxy) -> None:
    reader, writer = await asyncio.open_connection(proxy.host, proxy.port)
    writer.write(b"a")
    assert await _read(reader, 1) == b"a"
    proxy.cut()
    writer.write(b"bc")
    with pytest.raises(TimeoutError):
        await _read(reader, 1, timeout=4 * LATENCY)
    proxy.heal()
    assert await _read(reader, 2) == b"bc"
    writer.close()


async def test_a_reset_cut_closes_connections_and_refuses_new_ones(proxy: DelayProxy) -> None:
    reader, writer = await asyncio.open_connection(proxy.host, proxy.port)
    writer.write(b"a")
    assert await _read(reader, 1) == b"a"
    proxy.cut(reset=True)
    assert await _closed(reader)
    refused_reader, refused = await asyncio.open_connection(proxy.host, proxy.port)
    assert await _closed(refused_reader)
    proxy.heal()
    reader, writer = await asyncio.open_connection(proxy.host, proxy.port)
    writer.write(b"d")
    assert await _read(reader, 1) == b"d"
    for end in (writer, refused):
        end.close()
