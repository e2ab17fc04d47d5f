"""Translate between rlslice errors and gRPC status codes (an adapter at the edge)."""

from __future__ import annotations

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


def error_from_rpc(error: grpc.RpcError) -> e.RlsliceError:
    """The rlslice error a client raises for a failed call."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    cls = _FROM_CODE.get(code, e.RlsliceError)
    return cls(details or code.name)


async def abort_with(
    context: grpc.aio.ServicerContext[object, object], error: e.RlsliceError
) -> None:
    """Abort a grpc.aio call with the status code and one-line message for `error`."""
    message = str(error).splitlines()[0] if str(error) else type(error).__name__
    await context.abort(status_code_for(error), message)
