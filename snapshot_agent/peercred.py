"""Who is calling over the agent's Unix socket: SO_PEERCRED, handed to gRPC by connection.

gRPC does not tell a servicer the pid behind a Unix-socket call. So the agent accepts
connections on the public socket itself, reads the caller's credentials from the kernel
(SO_PEERCRED: pid, uid, gid, as of connect), and relays the bytes to the LocalAgent gRPC
server on a private socket in a 0700 folder (`private_folder`: fixed per agent, emptied at
start, so a killed agent leaves nothing that piles up). Each relayed connection comes from its own
client address (`<private>/c<n>`), which gRPC reports as the call's peer; `peer()` maps it
back to the credentials. A call that does not come through the relay has no mapping and is
refused. No request field ever names the pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
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


# sun_path holds 108 bytes; a relayed client's address is `<private>/c<n>`.
_MAX_PRIVATE_PATH = 90


def private_folder(state_dir: Path) -> Path:
    """Where the relay's private sockets live: `<state_dir>/relay`, or, when that path is
    too long for a Unix socket address, a fixed name in the temporary directory derived
    from the state directory (so the same agent always reuses, and cleans, the same one)."""
    preferred = state_dir / "relay"
    if len(os.fsencode(preferred)) <= _MAX_PRIVATE_PATH:
        return preferred
    digest = hashlib.sha256(os.fsencode(state_dir.resolve())).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"rlslice-agent-{digest}"


def _fresh_private(folder: Path) -> Path:
    """Empty `folder` (a leftover of a killed agent) and make it anew, 0700 and ours; refuse
    when a live agent still serves from it."""
    inner = folder / "g"
    if inner.is_socket():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(inner))
        except OSError:
            pass  # nobody listens: a leftover
        else:
            raise SocketInUseError(f"state_dir: another live agent uses {folder}")
        finally:
            probe.close()
    shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.mkdir(mode=0o700)  # fails if someone else made it in between: fail closed
    info = folder.lstat()
    if info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise PermissionError(f"state_dir: private relay folder {folder} is not ours alone")
    return folder


class PeerCredRelay:
    """The public Unix socket in front of the private LocalAgent gRPC server."""

    def __init__(self, public_path: Path, mode: int, private: Path) -> None:
        self.public_path = public_path
        self._mode = mode
        self._private = _fresh_private(private)
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
