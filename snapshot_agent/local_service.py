"""The LocalAgent gRPC service (Unix socket only): job processes register themselves, and
`app` workloads keep a command stream open.

The caller's pid always comes from the relay's SO_PEERCRED (`peercred.PeerCredRelay`); a
call that did not come through the relay is refused, and so is a caller that has exited.
A job is bound to the uid that first registered it: Register or Workload for that job
from another uid is refused PERMISSION_DENIED, and its modes, tags and stream stay.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from rlslice._errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    PermissionDeniedError,
    RlsliceError,
)
from rlslice.adapters.grpc_errors import abort_with
from rlslice.snapshot_agent.backends.base import OffloadAction, WorkloadAnswer
from rlslice.snapshot_agent.engine import AgentEngine
from rlslice.snapshot_agent.jobs import LocalJobServer
from rlslice.snapshot_agent.peercred import PeerCredRelay
from rlslice.snapshot_agent.processes import ProcessRef, alive
from rlslice.v1alpha1 import agent_pb2, agent_pb2_grpc

log = logging.getLogger(__name__)
Context = grpc.aio.ServicerContext[Any, Any]

_MODES = {agent_pb2.OFFLOAD_MODE_OFFLOAD: "offload", agent_pb2.OFFLOAD_MODE_DISCARD: "discard"}
_EOF: object = grpc.aio.EOF  # type: ignore[attr-defined]
_SERVER_KINDS = ("vllm", "sglang")
_MAX_TAGS = 64


def environ_rank(pid: int) -> int | None:
    """`RANK` from the process's initial environment (torchrun, srun and the launchers set
    it), so a move's error can name the rank; None when unreadable or unset."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    for item in raw.split(b"\0"):
        if item.startswith(b"RANK="):
            text = item[5:].decode(errors="replace")
            return int(text) if text.isdigit() else None
    return None


def _modes(values: Sequence[int]) -> tuple[str, ...]:
    modes = []
    for value in values:
        if value not in _MODES:
            raise InvalidArgumentError(f"modes: {value} is not an offload mode")
        modes.append(_MODES[value])  # type: ignore[index]
    return tuple(dict.fromkeys(modes))


def _tags(values: Sequence[str]) -> tuple[str, ...]:
    if len(values) > _MAX_TAGS:
        raise InvalidArgumentError(f"tags: {len(values)} given, at most {_MAX_TAGS}")
    for tag in values:
        if not tag or len(tag) > 63 or not tag.isprintable():
            raise InvalidArgumentError(f"tags: {tag!r} is not a tag (1-63 printable characters)")
    return tuple(values)


class StreamWorkload:
    """One workload's command stream, as the `app` backend sees it (`WorkloadLink`)."""

    def __init__(
        self,
        modes: Sequence[str],
        tags: Sequence[str],
        local_server: LocalJobServer | None,
        *,
        pid: int = 0,
        rank: int | None = None,
    ) -> None:
        self.pid = pid
        self.rank = rank
        self.modes = frozenset(modes)
        self.tags = tuple(tags)
        self.local_server = None if local_server is None else (local_server.kind, local_server.port)
        self._outbox: asyncio.Queue[agent_pb2.WorkloadCommand | None] = asyncio.Queue()
        self._pending: dict[int, asyncio.Future[WorkloadAnswer]] = {}
        self._ids = itertools.count(1)
        self.closed = False

    async def command(
        self,
        action: OffloadAction,
        *,
        epoch: int,
        discard_tags: Sequence[str],
        timeout: float,
        offload_tags: Sequence[str] | None = None,
    ) -> WorkloadAnswer:
        if self.closed:
            raise ConnectionError("the workload's stream is closed")
        command_id = next(self._ids)
        future: asyncio.Future[WorkloadAnswer] = asyncio.get_running_loop().create_future()
        self._pending[command_id] = future
        wire = (
            agent_pb2.WorkloadCommand.ACTION_OFFLOAD
            if action is OffloadAction.OFFLOAD
            else agent_pb2.WorkloadCommand.ACTION_RESTORE
        )
        await self._outbox.put(
            agent_pb2.WorkloadCommand(
                command_id=command_id,
                action=wire,
                discard_tags=list(discard_tags),
                epoch=epoch,
                offload_tags=list(offload_tags or ()),
                partial=offload_tags is not None,
            )
        )
        try:
            return await asyncio.wait_for(future, timeout)
        finally:
            self._pending.pop(command_id, None)

    async def next_command(self) -> agent_pb2.WorkloadCommand | None:
        """The next command to send; None once the link is closed."""
        return await self._outbox.get()

    def answer(self, reply: agent_pb2.WorkloadReply) -> None:
        future = self._pending.get(reply.command_id)
        if future is not None and not future.done():
            future.set_result(
                WorkloadAnswer(
                    reply.ok,
                    reply.bytes,
                    reply.seconds,
                    reply.error.splitlines()[0] if reply.error else "",
                    reply.pinned_bytes,
                )
            )

    def close(self) -> None:
        self.closed = True
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ConnectionError("the workload's stream closed"))
        self._outbox.put_nowait(None)


class LocalAgentServicer(agent_pb2_grpc.LocalAgentServicer):
    """Register and Workload, for processes on this node."""

    def __init__(self, engine: AgentEngine, relay: PeerCredRelay) -> None:
        self._engine = engine
        self._relay = relay

    def _caller(self, context: Context) -> tuple[ProcessRef, int]:
        """The calling process and its uid, from the socket's peer credentials."""
        peer = self._relay.peer(context.peer())
        if peer is None:
            raise PermissionDeniedError(
                "local registration: only through the agent's Unix socket (peer unknown)"
            )
        if peer.ref is None or not alive(peer.ref):
            raise FailedPreconditionError(f"local registration: process {peer.pid} has exited")
        return peer.ref, peer.uid

    async def Register(
        self, request: agent_pb2.LocalRegisterRequest, context: Context
    ) -> agent_pb2.LocalRegisterResponse:
        try:
            ref, uid = self._caller(context)
            server = None
            if request.local_server_kind or request.local_server_port:
                if request.local_server_kind not in _SERVER_KINDS:
                    raise InvalidArgumentError(
                        f"local_server_kind: {request.local_server_kind!r} is not vllm or sglang"
                    )
                if not 0 < request.local_server_port < 65536:
                    raise InvalidArgumentError(
                        f"local_server_port: {request.local_server_port} is not a port"
                    )
                server = LocalJobServer(request.local_server_kind, request.local_server_port)
            backend = self._engine.register(
                ref,
                request.job,
                request.group,
                backend=request.backend,
                modes=_modes(request.modes),
                tags=_tags(request.tags),
                local_server=server,
                uid=uid,
            )
        except RlsliceError as error:
            await abort_with(context, error)
            raise AssertionError("unreachable") from error  # pragma: no cover
        log.info("job %s: registered pid %d (group %s)", request.job, ref.pid, request.group)
        return agent_pb2.LocalRegisterResponse(pid=ref.pid, node=self._engine.node, backend=backend)

    async def Workload(self, request_iterator: Any, context: Context) -> None:  # type: ignore[override]
        try:
            ref, uid = self._caller(context)
            first = await context.read()
            if first is _EOF or not first.HasField("hello"):
                raise InvalidArgumentError("hello: the first message must carry hello")
            hello = first.hello
            modes, tags = _modes(hello.modes), _tags(hello.tags)
            self._engine.register(ref, hello.job, hello.group, modes=modes, tags=tags, uid=uid)
        except RlsliceError as error:
            await abort_with(context, error)
            return
        entry = self._engine.table.entries[hello.job]
        link = StreamWorkload(
            modes, tags, entry.local_server, pid=ref.pid, rank=environ_rank(ref.pid)
        )
        self._engine.attach_workload(hello.job, link)
        reader = asyncio.ensure_future(self._read_replies(context, link))
        try:
            while (command := await link.next_command()) is not None:
                await context.write(command)
        finally:
            reader.cancel()
            link.close()
            self._engine.detach_workload(hello.job, link)

    async def _read_replies(self, context: Context, link: StreamWorkload) -> None:
        try:
            while (message := await context.read()) is not _EOF:
                if message.HasField("reply"):
                    link.answer(message.reply)
        finally:
            link.close()
