"""Request field checks: each raises InvalidArgumentError with a one-line message naming the
field. Pure; the service calls these before touching any state."""

from __future__ import annotations

import math
import re

from pydantic import ValidationError

from rlslice._errors import InvalidArgumentError
from rlslice._ids import validate_id, validate_seconds
from rlslice.adapters.wire import group_spec_from_proto
from rlslice.config import MAX_LEASE_SECONDS, GroupSpec, first_error
from rlslice.v1alpha1 import scheduler_pb2 as pb

MIN_LEASE_SECONDS = 0.1
MAX_PHASE_LENGTH = 63
MAX_ADDRESS_LENGTH = 255
_LEASE_ID = re.compile(r"^[0-9a-f]{1,64}$")
_SESSION = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def job_id(value: str, field: str = "job") -> str:
    return validate_id(value, field)


def lease(lease_id: str, secret: str) -> None:
    """A lease id is hex; a secret is non-empty and bounded."""
    if not lease_id:
        raise InvalidArgumentError("lease_id: must not be empty")
    if not _LEASE_ID.fullmatch(lease_id):
        raise InvalidArgumentError("lease_id: not a lease id returned by Register")
    if not secret:
        raise InvalidArgumentError("secret: must not be empty")
    if len(secret) > 256:
        raise InvalidArgumentError(f"secret: {len(secret)} characters, at most 256 allowed")


def phase(value: str) -> str:
    if len(value) > MAX_PHASE_LENGTH:
        raise InvalidArgumentError(
            f"phase: {len(value)} characters, at most {MAX_PHASE_LENGTH} allowed"
        )
    if not value.isprintable():
        raise InvalidArgumentError("phase: must be printable text")
    return value


def register(request: pb.RegisterRequest) -> None:
    validate_id(request.job, "job")
    validate_id(request.group, "group")
    validate_seconds(
        request.lease_seconds,
        "lease_seconds",
        minimum=MIN_LEASE_SECONDS,
        maximum=MAX_LEASE_SECONDS,
    )
    if request.HasField("priority") and not -1000 <= request.priority <= 1000:
        raise InvalidArgumentError(f"priority: {request.priority} is outside [-1000, 1000]")
    if request.HasField("weight") and not (
        math.isfinite(request.weight) and 0 < request.weight <= 1000
    ):
        raise InvalidArgumentError(f"weight: {request.weight} is outside (0, 1000]")
    if request.device_bytes < 0:
        raise InvalidArgumentError(f"device_bytes: {request.device_bytes} is negative")
    if request.session and not _SESSION.fullmatch(request.session):
        raise InvalidArgumentError(
            f"session: {request.session[:64]!r} must be 1 to 64 letters, digits, '-' or '_'"
        )


def group_spec(request: pb.PutGroupRequest) -> GroupSpec:
    if not request.HasField("spec"):
        raise InvalidArgumentError("spec: required")
    try:
        return group_spec_from_proto(request.spec)
    except ValidationError as error:
        loc, message = first_error(error)
        field = ".".join(("spec", *loc))
        raise InvalidArgumentError(f"{field}: {message}") from None


def agent(request: pb.RegisterAgentRequest) -> None:
    validate_id(request.node, "node")
    if not request.address:
        raise InvalidArgumentError("address: must not be empty")
    if len(request.address) > MAX_ADDRESS_LENGTH or not request.address.isprintable():
        raise InvalidArgumentError("address: must be printable host:port, at most 255 characters")
    if not request.address.startswith("unix:") and ":" not in request.address:
        raise InvalidArgumentError(f"address: {request.address!r} is not host:port")
    if any(size < 0 for size in request.device_total_bytes):
        raise InvalidArgumentError("device_total_bytes: sizes must not be negative")
    if request.host_available_bytes < 0:
        raise InvalidArgumentError("host_available_bytes: must not be negative")
    if len(request.backends) > 16 or any(len(b) > 63 for b in request.backends):
        raise InvalidArgumentError("backends: at most 16 names of at most 63 characters")
