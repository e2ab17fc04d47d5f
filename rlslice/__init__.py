"""rlslice: independent RL jobs take turns on the same GPUs.

The public surface is small and pinned by a test: the clients, the grant and yield results
they return, and the errors they raise (a cancelled call raises asyncio's own
`CancelledError`, never one of ours). Everything else lives in component subpackages.
"""

from typing import TYPE_CHECKING

from rlslice._errors import (
    AbortedError,
    AlreadyExistsError,
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    LockLostError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    RlsliceError,
    UnauthenticatedError,
    UnavailableError,
)
from rlslice._version import __version__

if TYPE_CHECKING:  # type checkers see the real classes; at run time they load lazily
    from rlslice.client import AsyncClient, Client, Grant, YieldResult

__all__ = [
    "AbortedError",
    "AlreadyExistsError",
    "AsyncClient",
    "Client",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "Grant",
    "InternalError",
    "InvalidArgumentError",
    "LockLostError",
    "NotFoundError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "RlsliceError",
    "UnauthenticatedError",
    "UnavailableError",
    "YieldResult",
    "__version__",
]


def __getattr__(name: str) -> object:
    # The client pulls in grpc; import it on first use so `rlslice --version` and the
    # pure cores stay light.
    if name in {"Client", "AsyncClient", "Grant", "YieldResult"}:
        from rlslice import client

        return getattr(client, name)
    raise AttributeError(f"module 'rlslice' has no attribute {name!r}")
