"""A TCP proxy under the test's control: a slow link, and a partition switch.

`tc netem` needs the kernel's `sch_netem`, which the development VM lacks, so a link's
latency is made here instead: `DelayProxy` listens on an address in 127.0.0.0/8 and
forwards each connection to the real server, holding every chunk it reads in either
direction for `latency` seconds before writing it on. Each direction has a queue of
(release time, chunk): order is kept, and chunks read back to back leave back to back
(the throughput of the link is not one chunk per latency, as a sleep per chunk would make
it). The kernel below still acknowledges at once, so loss injected on the proxy's address
(`netfault.Nft.lose`) costs the usual retransmission on top of the latency.

`cut()` partitions the link the way a dropped route does for TCP: nothing crosses until
`heal()`, then what was held is delivered (TCP would have retransmitted it); `cut(reset=
True)` instead closes every connection and turns new ones away until `heal()`.

The proxy runs on an event loop of its own in a daemon thread, so a busy test loop never
delays it beyond its latency.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

_CHUNK = 1 << 16
_EOF = b""


class _Pipe:
    """One direction of one connection: read, hold for the latency, write in order."""

    def __init__(
        self,
        proxy: DelayProxy,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self._proxy = proxy
        self._reader = reader
        self._writer = writer
        self._queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def read(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while data := await self._reader.read(_CHUNK):
                self._queue.put_nowait((loop.time() + self._proxy.latency, data))
        except (ConnectionError, OSError):
            pass
        self._queue.put_nowait((loop.time() + self._proxy.latency, _EOF))

    async def write(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                release, data = await self._queue.get()
                if (wait := release - loop.time()) > 0:
                    await asyncio.sleep(wait)
                await self._proxy.healed.wait()
                if not data:  # the sender closed its side
                    if self._writer.can_write_eof():
                        self._writer.write_eof()
                    return
                self._writer.write(data)
                await self._writer.drain()
        except (ConnectionError, OSError):
            pass


class DelayProxy:
    """Forward `listen` (host, port 0 for any) to `target`, `latency` seconds each way."""

    def __init__(self, host: str, target: tuple[str, int], latency: float) -> None:
        assert host.startswith("127."), "every address stays in 127.0.0.0/8"
        self.host = host
        self.target = target
        self.latency = latency
        self.port = 0
        self.connections = 0
        """Connections accepted so far (a reconnect shows here)."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._refuse = False
        self.healed = asyncio.Event()  # set: the link carries bytes; bound to self._loop

    @property
    def address(self) -> str:
        """host:port that clients dial instead of the target's."""
        return f"{self.host}:{self.port}"

    def start(self) -> DelayProxy:
        """Listen (returns once bound)."""
        self._thread.start()
        self._call(self._listen)
        return self

    async def _listen(self) -> None:
        self.healed.set()
        self._server = await asyncio.start_server(self._accept, self.host, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    def cut(self, *, reset: bool = False) -> None:
        """Partition the link: hold every byte until `heal()`; with `reset`, close every
        connection now and every new one at once until `heal()`."""

        async def cut() -> None:
            self.healed.clear()
            if reset:
                self._refuse = True
                for writer in list(self._writers):
                    writer.transport.abort()

        self._call(cut)

    def heal(self) -> None:
        """Let bytes cross again (held ones first, in order)."""

        async def heal() -> None:
            self._refuse = False
            self.healed.set()

        self._call(heal)

    def close(self) -> None:
        """Stop listening, drop every connection, end the thread."""
        if not self._thread.is_alive():
            return

        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            self.healed.set()

        self._call(close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> DelayProxy:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _call(self, make: Callable[[], Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(make(), self._loop).result(10)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self._refuse:
            writer.transport.abort()
            return
        self._writers.add(writer)
        upstream: asyncio.StreamWriter | None = None
        try:
            await self.healed.wait()
            up_reader, upstream = await asyncio.open_connection(*self.target)
            self._writers.add(upstream)
            out, back = _Pipe(self, reader, upstream), _Pipe(self, up_reader, writer)
            await asyncio.gather(out.read(), out.write(), back.read(), back.write())
        except (ConnectionError, OSError):
            pass
        finally:
            for end in (writer, upstream):
                if end is not None:
                    self._writers.discard(end)
                    end.transport.abort()
