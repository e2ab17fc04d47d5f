"""The exceptions rlslice raises, one per kind of failure a caller can act on.

Pure: no grpc here. `rlslice.adapters.grpc_errors` maps them to and from gRPC status codes.
Messages are one line and name the field or object they are about.
"""

from __future__ import annotations


class RlsliceError(Exception):
    """Base of every rlslice error."""


class InvalidArgumentError(RlsliceError, ValueError):
    """A field is malformed: the message names the field."""


class NotFoundError(RlsliceError, LookupError):
    """A group, job, lease or agent does not exist."""


class AlreadyExistsError(RlsliceError):
    """The thing asked for is already so (a duplicate acquire, say)."""


class FailedPreconditionError(RlsliceError):
    """The request is well formed but the state does not allow it (yield by a non-holder)."""


class PermissionDeniedError(RlsliceError, PermissionError):
    """The caller is known but may not do this (wrong lease secret, wrong token role)."""


class UnauthenticatedError(RlsliceError, PermissionError):
    """The caller did not prove who it is (no or unknown token)."""


class ResourceExhaustedError(RlsliceError):
    """Memory (device or host) or another capacity would be exceeded."""


class UnavailableError(RlsliceError, ConnectionError):
    """The peer cannot be reached, or the lease lapsed under a waiter."""


class DeadlineExceededError(RlsliceError, TimeoutError):
    """The call's deadline passed (an acquire timeout, say)."""


class AbortedError(RlsliceError):
    """The operation was aborted by a concurrent change (a switch rolled back, say)."""


class InternalError(RlsliceError):
    """A bug or an unexpected failure on the server side."""


class LockLostError(AbortedError):
    """The job lost a group's lock while it believed it held it: its lease lapsed (a
    partition from the scheduler, a stall) and the group may be someone else's now.

    Raised by a phase at its next call or at its exit. The job's GPU work was fenced
    (frozen or parked on every node of the group) before anyone else was granted; work
    done since `epoch` must not be committed. Acquire again to resume.
    """

    def __init__(self, message: str, *, group: str = "", job: str = "", epoch: int = 0) -> None:
        super().__init__(message)
        self.group = group
        self.job = job
        self.epoch = epoch
        """The epoch of the grant that was lost (its fencing token)."""
