"""The workload loop: answer the agent's offload commands over its Unix socket.

Connects to the agent's local socket (`socket_path`, `$RLSLICE_AGENT_SOCKET`, or the
agent's default path), registers
the calling process with the job (modes, tags, and the port of the job's own inference
server, if any), opens the `LocalAgent.Workload` stream, says `hello`, and answers every
OFFLOAD / RESTORE command with the bytes and seconds its offloaders report. Commands run
one at a time, in a thread, so the loop keeps the stream alive meanwhile. When the agent
restarts the stream ends; the loop reconnects with backoff (parked state stays parked:
a later RESTORE brings it back).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, cast

import grpc

from rlslice._errors import (
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    UnavailableError,
)
from rlslice._ids import validate_id
from rlslice.adapters.channel import open_channel
from rlslice.client._backoff import Backoff
from rlslice.client._local import ENV_AGENT_SOCKET, default_socket_path
from rlslice.client.offload._http import OffloadHttpServer
from rlslice.client.offload._types import (
    DISCARD,
    OFFLOAD,
    Offloader,
    OffloadResult,
    PartialOffloader,
)
from rlslice.v1alpha1 import agent_pb2, agent_pb2_grpc

log = logging.getLogger(__name__)

AGENT_SOCKET_ENV = ENV_AGENT_SOCKET
_EOF: object = grpc.aio.EOF  # type: ignore[attr-defined]
_MODES = {OFFLOAD: agent_pb2.OFFLOAD_MODE_OFFLOAD, DISCARD: agent_pb2.OFFLOAD_MODE_DISCARD}
# The agent refused us for good: reconnecting would only repeat the refusal.
_FATAL = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


class Combined:
    """Several offloaders as one: offload in order; on a failure, restore those already
    offloaded (newest first) and raise; restore in reverse order.

    A partial offload (`offload_tags` given) hands each offloader only its own tags and
    leaves one that none of the named tags reach alone (resident). An offloader that
    splits its parts (`splits_parts`, `TorchOffloader`) takes the tags named; any other
    (vLLM, SGLang, the transparent path) moves whole, so it is moved only when every tag
    it holds is named, and a partial offload naming some of its tags is refused before
    anything moves. A named tag that no offloader holds is refused too: nothing would
    free its memory."""

    splits_parts = True

    def __init__(self, offloaders: Sequence[Offloader]) -> None:
        if not offloaders:
            raise InvalidArgumentError("offloaders: at least one is needed")
        self.parts = tuple(offloaders)

    @property
    def modes(self) -> frozenset[str]:
        return frozenset().union(*(part.modes for part in self.parts))

    @property
    def tags(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(tag for part in self.parts for tag in part.tags))

    def offload(
        self, discard_tags: Sequence[str] = (), *, offload_tags: Sequence[str] | None = None
    ) -> OffloadResult:
        steps = (
            [(part, _whole_discards(part, discard_tags), None) for part in self.parts]
            if offload_tags is None
            else self._partial(discard_tags, offload_tags)
        )
        done: list[tuple[Offloader, OffloadResult]] = []
        try:
            for part, mine, copy in steps:
                if copy is None:
                    done.append((part, part.offload(mine)))
                else:
                    done.append(
                        (part, cast(PartialOffloader, part).offload(mine, offload_tags=copy))
                    )
        except BaseException:
            for part, _ in reversed(done):
                try:
                    part.restore()
                except Exception:
                    log.exception("offload rollback: restore failed")
            raise
        return OffloadResult(
            bytes=sum(r.bytes for _, r in done), seconds=sum(r.seconds for _, r in done)
        )

    def _partial(
        self, discard_tags: Sequence[str], offload_tags: Sequence[str]
    ) -> list[tuple[Offloader, list[str], list[str] | None]]:
        """Each offloader a partial offload moves, with its discard tags and its tags to
        copy (None: moved whole); refused before anything moves (see the class)."""
        unknown = [t for t in dict.fromkeys([*offload_tags, *discard_tags]) if t not in self.tags]
        if unknown:
            raise FailedPreconditionError(
                f"offload_tags: no offloader of this process holds {', '.join(unknown)} "
                f"(they hold {', '.join(self.tags) or 'nothing'}); nothing moved"
            )
        steps: list[tuple[Offloader, list[str], list[str] | None]] = []
        for part in self.parts:
            drops = DISCARD in part.modes
            discard = [t for t in discard_tags if t in part.tags] if drops else []
            # A part that cannot discard copies its discard tags instead: nothing is lost.
            named = [*offload_tags, *([] if drops else discard_tags)]
            copy = [t for t in dict.fromkeys(named) if t in part.tags and t not in discard]
            if not copy and not discard:
                continue  # none of its tags move: it stays resident
            if getattr(part, "splits_parts", False) is True:
                steps.append((part, discard, copy))
                continue
            left = [t for t in part.tags if t not in copy and t not in discard]
            if left:
                raise FailedPreconditionError(
                    f"{type(part).__name__} moves its tags ({', '.join(part.tags)}) together, "
                    f"not by part: a partial offload of {', '.join([*copy, *discard])} would "
                    f"leave {', '.join(left)} resident; nothing moved"
                )
            steps.append((part, discard, None))
        return steps

    def restore(self) -> OffloadResult:
        results: list[OffloadResult] = []
        errors: list[BaseException] = []
        for part in reversed(self.parts):
            try:
                results.append(part.restore())
            except Exception as error:  # try the others anyway: bring back what can come back
                errors.append(error)
        if errors:
            raise errors[0]
        return OffloadResult(
            bytes=sum(r.bytes for r in results), seconds=sum(r.seconds for r in results)
        )


def _whole_discards(part: Offloader, discard_tags: Sequence[str]) -> list[str]:
    """The discard tags of a whole offload that one offloader acts on: its own, if it can
    discard (one that cannot copies them instead)."""
    return [t for t in discard_tags if t in part.tags] if DISCARD in part.modes else []


async def answer(
    offloader: Offloader, command: agent_pb2.WorkloadCommand
) -> agent_pb2.WorkloadReply:
    """Run one command in a thread; the reply carries bytes and seconds, or the error.

    A partial OFFLOAD (`partial` set: copy `offload_tags`, free `discard_tags`, leave the
    rest) goes through `Combined`, which hands each offloader its own tags."""
    try:
        if command.action == agent_pb2.WorkloadCommand.ACTION_OFFLOAD and command.partial:
            parts = offloader if isinstance(offloader, Combined) else Combined([offloader])
            offload = functools.partial(
                parts.offload, list(command.discard_tags), offload_tags=list(command.offload_tags)
            )
            result = await asyncio.to_thread(offload)
        elif command.action == agent_pb2.WorkloadCommand.ACTION_OFFLOAD:
            result = await asyncio.to_thread(offloader.offload, list(command.discard_tags))
        elif command.action == agent_pb2.WorkloadCommand.ACTION_RESTORE:
            result = await asyncio.to_thread(offloader.restore)
        else:
            raise InvalidArgumentError(f"action: unknown value {command.action}")
    except Exception as error:
        log.warning("offload command %s failed: %s", command.command_id, error)
        return agent_pb2.WorkloadReply(
            command_id=command.command_id, ok=False, error=f"{type(error).__name__}: {error}"
        )
    return agent_pb2.WorkloadReply(
        command_id=command.command_id,
        ok=True,
        bytes=result.bytes,
        seconds=result.seconds,
        pinned_bytes=pinned_bytes(offloader),
    )


def pinned_bytes(offloader: object) -> int:
    """Host buffer bytes an offloader holds (0 for one that keeps none, or cannot tell)."""
    parts = getattr(offloader, "parts", None)
    if parts is not None:
        return sum(pinned_bytes(part) for part in parts)
    value = getattr(offloader, "pinned_bytes", 0)
    return int(value) if isinstance(value, int) else 0


async def serve_offload(
    offloaders: Offloader | Sequence[Offloader],
    *,
    job: str,
    group: str,
    socket_path: str | None = None,
    register: bool = True,
    reconnect: bool = True,
    on_connected: Callable[[], object] | None = None,
) -> None:
    """Answer the agent's offload commands until cancelled.

    `offloaders`: a `TorchOffloader`, `VllmOffloader`, `SglangOffloader`, or several.
    `socket_path`: the agent's Unix socket (default: `$RLSLICE_AGENT_SOCKET`, else the
    agent's default path).
    `register`: register this process with the agent first (with the modes, tags and the
    local server's port); leave it on unless the process registered itself already.
    `on_connected`: called each time the stream to the agent is open (registered, and the
    stream's hello sent), so a job can wait for it before its first phase.
    """
    validate_id(job, "job")
    validate_id(group, "group")
    parts = [offloaders] if isinstance(offloaders, Offloader) else list(offloaders)
    offloader = Combined(parts)
    path = str(socket_path or default_socket_path())
    modes = [_MODES[mode] for mode in sorted(offloader.modes)]
    server = next((p for p in parts if isinstance(p, OffloadHttpServer)), None)
    delays = Backoff(initial=0.1, cap=5.0).delays()
    while True:
        try:
            async with open_channel(f"unix:{path}") as channel:
                stub: Any = agent_pb2_grpc.LocalAgentStub(channel)
                if register:
                    await stub.Register(
                        agent_pb2.LocalRegisterRequest(
                            job=job,
                            group=group,
                            modes=modes,
                            tags=list(offloader.tags),
                            backend="app",
                            local_server_port=server.port if server else 0,
                            local_server_kind=server.kind if server else "",
                        ),
                        timeout=30.0,
                    )
                await _stream(stub, offloader, job, group, modes, on_connected)
                delays = Backoff(initial=0.1, cap=5.0).delays()  # a clean end: start over
        except grpc.aio.AioRpcError as error:
            if error.code() in _FATAL or not reconnect:
                raise
            log.info("agent stream ended (%s); reconnecting", error.code().name)
        if not reconnect:
            return
        await asyncio.sleep(next(delays))


async def _stream(
    stub: Any,
    offloader: Offloader,
    job: str,
    group: str,
    modes: list[agent_pb2.OffloadMode.ValueType],
    on_connected: Callable[[], object] | None,
) -> None:
    call = stub.Workload()
    await call.write(
        agent_pb2.WorkloadMessage(
            hello=agent_pb2.WorkloadHello(
                job=job, group=group, modes=modes, tags=list(offloader.tags)
            )
        )
    )
    if on_connected is not None:
        on_connected()
    while True:
        command = await call.read()
        if command is _EOF:
            return
        reply = await answer(offloader, command)
        try:
            await call.write(agent_pb2.WorkloadMessage(reply=reply))
        except (asyncio.InvalidStateError, grpc.aio.AioRpcError) as error:
            # The stream broke while the command ran: the agent counts the move as failed
            # and rolls back, but its rollback can no longer reach this process. Undo the
            # move here so the job is where the agent believes it is, then reconnect.
            log.warning("agent stream broke before the reply to %s: %s", command.command_id, error)
            if reply.ok:
                await _undo(offloader, command)
            return


async def _undo(offloader: Offloader, command: agent_pb2.WorkloadCommand) -> None:
    """Reverse a command whose success the agent never heard (an offload is restored, a
    restore offloaded again, keeping every tag); a failure is logged, the loop goes on."""
    undo = agent_pb2.WorkloadCommand(
        command_id=command.command_id,
        action=(
            agent_pb2.WorkloadCommand.ACTION_RESTORE
            if command.action == agent_pb2.WorkloadCommand.ACTION_OFFLOAD
            else agent_pb2.WorkloadCommand.ACTION_OFFLOAD
        ),
    )
    reply = await answer(offloader, undo)
    if not reply.ok:
        log.error("could not undo %s after the stream broke: %s", command.command_id, reply.error)


class OffloadThread:
    """`serve_offload` on a private event loop in a daemon thread, for synchronous jobs."""

    def __init__(self, offloaders: Offloader | Sequence[Offloader], **kwargs: object) -> None:
        self._loop = asyncio.new_event_loop()
        self._task: asyncio.Task[None] | None = None
        self._ready = threading.Event()
        self._connected = threading.Event()
        self.error: BaseException | None = None

        async def main() -> None:
            self._task = asyncio.current_task()
            self._ready.set()
            try:
                await serve_offload(
                    offloaders,
                    on_connected=self._connected.set,
                    **kwargs,  # type: ignore[arg-type]
                )
            except asyncio.CancelledError:
                pass
            except BaseException as error:
                self.error = error
                log.error("offload loop stopped: %s", error)
            finally:
                self._connected.set()  # wake a waiter: it reports `error`

        self._thread = threading.Thread(
            target=self._loop.run_until_complete,
            args=(main(),),
            name="rlslice-offload",
            daemon=True,
        )
        self._thread.start()
        self._ready.wait()

    def wait_connected(self, timeout: float = 30.0) -> None:
        """Block until the agent has this process's registration and its offload stream, so
        that a switch right after finds the job ready to offload. Raises UnavailableError if
        the loop stopped (its error attached), DeadlineExceededError after `timeout` s."""
        if not self._connected.wait(timeout):
            raise DeadlineExceededError(
                f"timeout: no offload stream to the agent within {timeout:g} s"
            )
        if self.error is not None or not self._thread.is_alive():
            raise UnavailableError(f"offload loop stopped: {self.error}") from self.error

    def stop(self, timeout: float = 5.0) -> None:
        """Close the stream and end the thread."""
        if self._task is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(timeout)


def start_offload_thread(
    offloaders: Offloader | Sequence[Offloader],
    *,
    job: str,
    group: str,
    socket_path: str | None = None,
    register: bool = True,
) -> OffloadThread:
    """Run `serve_offload` in the background of a synchronous program; `.stop()` ends it."""
    return OffloadThread(
        offloaders, job=job, group=group, socket_path=socket_path, register=register
    )
