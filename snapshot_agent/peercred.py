"""Who is calling over the agent's Unix socket: SO_PEERCRED, handed to gRPC by connection.

gRPC does not tell a servicer the pid behind a Unix-socket call. So the agent accepts
connections on the public socket itself, reads the caller's credentials from the kernel
(SO_PEERCRED: pid, uid, gid, as of connect), and relays the bytes to the LocalAgent gRPC
server on a private socket in a 0700 folder. Each relayed connection comes from its own
client address (`<private>/c<n>`), which gRPC reports as the call's peer; `peer()` maps it
back to the credentials. A call that does not come through the relay has no mapping and is
refused. No request field ever names the pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import shutil
import socket
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rlslice.snapshot_agent.processes import ProcessRef, identify

log = logging.getLogger(__name__)
_CRED = struct.Struct("3i")


@dataclass(frozen=True)
class Peer:
    """The process at the other end of a local connection, as the kernel reported it."""

    pid: int
    uid: int
    gid: int
    ref: ProcessRef | None
    """The process identified at accept time (None if it was already gone)."""


class SocketInUseError(RuntimeError):
    """Another live agent listens on the socket path."""


def _remove_stale(path: Path) -> None:
    if not path.exists() and not path.is_symlink():
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink()  # nobody listens: a leftover of an agent that died
    else:
        raise SocketInUseError(f"socket_path: another agent listens on {path}")
    finally:
        probe.close()


class PeerCredRelay:
    """The public Unix socket in front of the private LocalAgent gRPC server."""

    def __init__(self, public_path: Path, mode: int) -> None:
        self.public_path = public_path
        self._mode = mode
        self._private = Path(tempfile.mkdtemp(prefix="rlslice-agent-"))  # mode 0700
        self.internal_address = f"unix:{self._private / 'g'}"
        self._peers: dict[str, Peer] = {}
        self._counter = itertools.count()
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        """Listen on the public path (the private gRPC server must be serving)."""
        self.public_path.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale(self.public_path)
        self._server = await asyncio.start_unix_server(self._accept, path=str(self.public_path))
        os.chmod(self.public_path, self._mode)

    def peer(self, grpc_peer: str) -> Peer | None:
        """The credentials behind a gRPC call's `context.peer()`, or None (not relayed)."""
        return self._peers.get(grpc_peer)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        pid, uid, gid = _CRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size)
        )
        peer = Peer(pid, uid, gid, identify(pid) if pid > 0 else None)
        client_path = self._private / f"c{next(self._counter)}"
        inner = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        key = f"unix:{client_path}"
        try:
            inner.bind(str(client_path))
            inner.setblocking(False)
            self._peers[key] = peer
            await asyncio.get_running_loop().sock_connect(inner, self.internal_address[5:])
            inner_reader, inner_writer = await asyncio.open_unix_connection(sock=inner)
        except OSError as error:
            log.warning("local connection from pid %d not relayed: %s", pid, error)
            self._peers.pop(key, None)
            inner.close()
            writer.close()
            with contextlib.suppress(FileNotFoundError):
                client_path.unlink()
            return
        self._writers.update((writer, inner_writer))
        try:
            await asyncio.gather(_pump(reader, inner_writer), _pump(inner_reader, writer))
        finally:
            self._writers.difference_update((writer, inner_writer))
            # Forget the mapping before the address can be bound again.
            self._peers.pop(key, None)
            with contextlib.suppress(FileNotFoundError):
                client_path.unlink()

    async def stop(self) -> None:
        """Stop listening, drop the public socket and the private folder."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            self._server = None
        for writer in list(self._writers):
            writer.close()
        with contextlib.suppress(FileNotFoundError):
            self.public_path.unlink()
        shutil.rmtree(self._private, ignore_errors=True)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()
