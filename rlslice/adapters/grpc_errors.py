"""Translate between rlslice errors and gRPC status codes (an adapter at the edge).

The one error translator of both servers: `answer(context, work)` runs a handler's work and
turns an rlslice error into its status code and one-line message, and anything else into
INTERNAL (logged with its traceback under an incident id; the caller gets only that id,
never the exception's text, which may hold paths, secrets or other tenants' names); clients turn a failed call
back into the rlslice error with `error_from_rpc`.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from rlslice import _errors as e

_TO_CODE: dict[type[e.RlsliceError], grpc.StatusCode] = {
    e.InvalidArgumentError: grpc.StatusCode.INVALID_ARGUMENT,
    e.NotFoundError: grpc.StatusCode.NOT_FOUND,
    e.AlreadyExistsError: grpc.StatusCode.ALREADY_EXISTS,
    e.FailedPreconditionError: grpc.StatusCode.FAILED_PRECONDITION,
    e.PermissionDeniedError: grpc.StatusCode.PERMISSION_DENIED,
    e.UnauthenticatedError: grpc.StatusCode.UNAUTHENTICATED,
    e.ResourceExhaustedError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    e.UnavailableError: grpc.StatusCode.UNAVAILABLE,
    e.DeadlineExceededError: grpc.StatusCode.DEADLINE_EXCEEDED,
    e.AbortedError: grpc.StatusCode.ABORTED,
    e.InternalError: grpc.StatusCode.INTERNAL,
}
_FROM_CODE: dict[grpc.StatusCode, type[e.RlsliceError]] = {v: k for k, v in _TO_CODE.items()}


def status_code_for(error: e.RlsliceError) -> grpc.StatusCode:
    """The gRPC status code a server answers `error` with."""
    for cls in type(error).__mro__:
        if cls in _TO_CODE:
            return _TO_CODE[cls]
    return grpc.StatusCode.INTERNAL


def error_for_code(code: grpc.StatusCode) -> type[e.RlsliceError]:
    """The rlslice error kind a failed call's status code means."""
    return _FROM_CODE.get(code, e.RlsliceError)


def error_from_rpc(error: grpc.RpcError) -> e.RlsliceError:
    """The rlslice error a client raises for a failed call."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    return error_for_code(code)(details or code.name)


T = TypeVar("T")
_log = logging.getLogger(__name__)


async def answer(
    context: grpc.aio.ServicerContext[object, object],
    work: Callable[[], Awaitable[T]],
    *,
    log: logging.Logger = _log,
) -> T:
    """`await work()`; an rlslice error aborts the call with its status and one-line
    message, any other exception with INTERNAL: its traceback goes to `log` under an
    incident id, and the caller is told only that id."""
    try:
        return await work()
    except e.RlsliceError as error:
        await abort_with(context, error)
    except Exception as error:
        incident = secrets.token_hex(4)
        log.exception("call failed (incident %s): %s: %s", incident, type(error).__name__, error)
        await abort_with(
            context, e.InternalError(f"internal error (incident {incident}, in the server's log)")
        )
    raise AssertionError("abort returns by raising")  # pragma: no cover


async def abort_with(
    context: grpc.aio.ServicerContext[object, object], error: e.RlsliceError
) -> None:
    """Abort a grpc.aio call with the status code and one-line message for `error`."""
    message = str(error).splitlines()[0] if str(error) else type(error).__name__
    await context.abort(status_code_for(error), message)
