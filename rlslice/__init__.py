"""rlslice: independent RL jobs take turns on the same GPUs.

The public surface is small and pinned by a test: the clients, the grant they return,
and the errors they raise. Everything else lives in component subpackages.
"""

from rlslice._errors import (
    AbortedError,
    AlreadyExistsError,
    CancelledError,
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    RlsliceError,
    UnauthenticatedError,
    UnavailableError,
)
from rlslice._version import __version__

__all__ = [
    "AbortedError",
    "AlreadyExistsError",
    "AsyncClient",
    "CancelledError",
    "Client",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "Grant",
    "InternalError",
    "InvalidArgumentError",
    "NotFoundError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "RlsliceError",
    "UnauthenticatedError",
    "UnavailableError",
    "__version__",
]


def __getattr__(name: str) -> object:
    # The client pulls in grpc; import it on first use so `rlslice --version` and the
    # pure cores stay light.
    if name in {"Client", "AsyncClient", "Grant"}:
        from rlslice import client

        return getattr(client, name)
    raise AttributeError(f"module 'rlslice' has no attribute {name!r}")
