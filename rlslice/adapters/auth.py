"""Bearer-token roles for gRPC servers: a job token, an admin token, an agent token.

A method names the role it needs; a role with no token configured is open (standalone on
loopback). The admin token satisfies every role. Tokens are compared in constant time and
never logged. Missing or unknown token -> UNAUTHENTICATED; a valid token of another role ->
PERMISSION_DENIED. Handlers never run for refused calls, so a refusal changes nothing.
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Awaitable, Callable, Collection, Mapping
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
