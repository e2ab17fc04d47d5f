"""Bearer-token roles for gRPC servers: a job token, an admin token, an agent token.

A method names the role it needs; a role with no token configured is open (standalone on
loopback). The admin token satisfies every role. Tokens are compared in constant time and
never logged. Missing or unknown token -> UNAUTHENTICATED; a valid token of another role ->
PERMISSION_DENIED. Handlers never run for refused calls, so a refusal changes nothing.
"""

from __future__ import annotations

import enum
import hmac
import os
import secrets
from collections.abc import Awaitable, Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import grpc

from rlslice.adapters.channel import bearer_token


class Role(enum.StrEnum):
    """Who may call a method."""

    JOB = "job"
    """Training jobs: register, acquire, yield, read state."""
    ADMIN = "admin"
    """Operators and the Kubernetes operator: put and delete groups; satisfies every role."""
    AGENT = "agent"
    """Node agents calling the scheduler, and the scheduler calling agents."""


#: Name of the node-local agent token file, in the user's rlslice state directory.
LOCAL_AGENT_TOKEN_FILE = "agent-token"


def default_agent_token_path() -> Path:
    """`<user state dir>/rlslice/agent-token`: `$XDG_STATE_HOME`, else `~/.local/state` (the
    XDG rule platformdirs follows on Linux; written here so the base install needs nothing)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "rlslice" / LOCAL_AGENT_TOKEN_FILE


def local_agent_token(path: Path | None = None) -> str:
    """The node-local agent token: read from `path` (default `default_agent_token_path()`),
    created there with a random value (mode 0600, folder 0700) when missing.

    An agent and a scheduler on one host, run by one user (or root) with no agent token
    configured, both take this token, so the Agent service is never open: other users of
    the host cannot read the file. Raises `PermissionError` when the file is another
    user's or readable by group or others, `OSError` when it cannot be read or written.
    """
    path = path or default_agent_token_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(32) + "\n")
    for _ in range(50):  # another process may have created it and be writing it now
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd) as handle:
            info = os.fstat(handle.fileno())
            if info.st_uid != os.geteuid() or info.st_mode & 0o077:
                raise PermissionError(
                    f"agent token: {path} must be owned by uid {os.geteuid()} and mode 0600"
                )
            token = handle.read().strip()
        if token:
            return token
        import time

        time.sleep(0.01)
    raise OSError(f"agent token: {path} is empty")


def roles_of(token: str | None, tokens: Mapping[Role, str]) -> set[Role]:
    """Roles that `token` proves."""
    if not token:
        return set()
    return {
        role
        for role, expected in tokens.items()
        if expected and hmac.compare_digest(token, expected)
    }


def check(
    token: str | None, needed: Role | None, tokens: Mapping[Role, str]
) -> tuple[grpc.StatusCode, str] | None:
    """None when the call may go on, else the status and one-line message to refuse it."""
    if needed is None or not tokens.get(needed):
        return None
    held = roles_of(token, tokens)
    if needed in held or Role.ADMIN in held:
        return None
    if not held:
        return (
            grpc.StatusCode.UNAUTHENTICATED,
            f"authorization: a valid bearer token for role '{needed.value}' is required",
        )
    return (
        grpc.StatusCode.PERMISSION_DENIED,
        f"authorization: this token's role may not call a '{needed.value}' method",
    )


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Refuses calls whose bearer token does not prove the role their method needs.

    `methods` maps full method names (`/rlslice.v1alpha1.Scheduler/PutGroup`) to roles
    (build it with `rlslice.adapters.server.method_roles`, which checks it against the proto).
    Methods of `open_services` (health, reflection) need no token. Any other served method
    that is not listed is refused with PERMISSION_DENIED, whatever the token: it fails
    closed. A method the server does not serve at all stays UNIMPLEMENTED.
    """

    def __init__(
        self,
        tokens: Mapping[Role, str],
        methods: Mapping[str, Role],
        open_services: Collection[str] = (),
    ) -> None:
        self._tokens = {role: token for role, token in tokens.items() if token}
        self._methods = dict(methods)
        self._open = frozenset(open_services)

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]
        ],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        needed = self._methods.get(details.method)
        if needed is None:
            handler: grpc.RpcMethodHandler[Any, Any] | None = await continuation(details)
            service = details.method.lstrip("/").partition("/")[0]
            if handler is None or service in self._open:
                return handler  # type: ignore[return-value]  # None: UNIMPLEMENTED, as served
            return _refusing_handler(
                handler,
                grpc.StatusCode.PERMISSION_DENIED,
                f"authorization: no role is defined for method {details.method}",
            )
        refusal = check(bearer_token(details.invocation_metadata), needed, self._tokens)
        if refusal is None:
            return await continuation(details)
        return _refusing_handler(await continuation(details), *refusal)


def _refusing_handler(
    handler: grpc.RpcMethodHandler[Any, Any] | None, code: grpc.StatusCode, message: str
) -> grpc.RpcMethodHandler[Any, Any]:
    async def abort(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(code, message)

    async def abort_stream(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(code, message)
        yield  # type: ignore[unreachable]  # makes this an async generator

    if handler is None:
        return grpc.unary_unary_rpc_method_handler(abort)
    deserializer = handler.request_deserializer
    serializer = handler.response_serializer
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(abort_stream, deserializer, serializer)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(abort_stream, deserializer, serializer)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(abort, deserializer, serializer)
    return grpc.unary_unary_rpc_method_handler(abort, deserializer, serializer)
