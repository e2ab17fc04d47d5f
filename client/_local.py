"""Register this process with the node's snapshot agent over its Unix socket.

The agent reads the caller's pid from the socket's peer credentials: a process can only
register itself (and, through the agent's tracking, its future children).

    from rlslice.client import register_with_agent

    registration = register_with_agent(None, "grpo-7b", "gpus-a")   # default socket
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from rlslice import env
from rlslice._ids import validate_id
from rlslice.adapters.grpc_errors import error_from_rpc
from rlslice.v1alpha1 import agent_pb2, agent_pb2_grpc

ENV_AGENT_SOCKET = env.AGENT_SOCKET
_MODES = {"offload": agent_pb2.OFFLOAD_MODE_OFFLOAD, "discard": agent_pb2.OFFLOAD_MODE_DISCARD}


def default_socket_path() -> Path:
    """`$RLSLICE_AGENT_SOCKET`, else the agent's default socket (`rlslice.env.agent_socket`)."""
    return env.agent_socket(os.environ)


@dataclass(frozen=True)
class LocalRegistration:
    """What the agent answered."""

    pid: int
    """The pid the agent read from the socket (this process, as the agent sees it)."""
    node: str
    """The agent's node name."""
    backend: str
    """Backend the agent will use for the job."""


def _request(
    job: str,
    group: str,
    backend: str,
    modes: Sequence[str],
    tags: Sequence[str],
    local_server: tuple[str, int] | None,
) -> agent_pb2.LocalRegisterRequest:
    validate_id(job, "job")
    validate_id(group, "group")
    unknown = [m for m in modes if m not in _MODES]
    if unknown:
        raise ValueError(f"modes: {unknown[0]!r} is not 'offload' or 'discard'")
    kind, port = local_server or ("", 0)
    return agent_pb2.LocalRegisterRequest(
        job=job,
        group=group,
        backend=backend,
        modes=[_MODES[m] for m in modes],
        tags=list(tags),
        local_server_kind=kind,
        local_server_port=port,
    )


def _target(socket_path: str | os.PathLike[str] | None) -> str:
    path = Path(socket_path) if socket_path else default_socket_path()
    return f"unix:{path}"


def _answer(response: agent_pb2.LocalRegisterResponse) -> LocalRegistration:
    return LocalRegistration(pid=response.pid, node=response.node, backend=response.backend)


def register_with_agent(
    socket_path: str | os.PathLike[str] | None,
    job: str,
    group: str,
    *,
    backend: str = "",
    modes: Sequence[str] = (),
    tags: Sequence[str] = (),
    local_server: tuple[str, int] | None = None,
    timeout: float = 10.0,
) -> LocalRegistration:
    """Register the calling process as part of `job` in `group` (blocking).

    `socket_path` None means `default_socket_path()`. Raises the rlslice error matching the
    agent's answer (UnavailableError when no agent listens there).
    """
    request = _request(job, group, backend, modes, tags, local_server)
    with grpc.insecure_channel(_target(socket_path)) as channel:
        try:
            response = agent_pb2_grpc.LocalAgentStub(channel).Register(request, timeout=timeout)
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None
    return _answer(response)


async def register_with_agent_async(
    socket_path: str | os.PathLike[str] | None,
    job: str,
    group: str,
    *,
    backend: str = "",
    modes: Sequence[str] = (),
    tags: Sequence[str] = (),
    local_server: tuple[str, int] | None = None,
    timeout: float = 10.0,
) -> LocalRegistration:
    """`register_with_agent` for asyncio code."""
    request = _request(job, group, backend, modes, tags, local_server)
    async with grpc.aio.insecure_channel(_target(socket_path)) as channel:
        try:
            stub: Any = agent_pb2_grpc.LocalAgentStub(channel)
            response = await stub.Register(request, timeout=timeout)
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None
    return _answer(response)
