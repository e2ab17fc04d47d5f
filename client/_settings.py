"""Resolve a client's settings from its arguments and the environment.

Arguments win over environment variables; empty values count as absent. Ids are validated
here, at construction, so a typo fails before any call with a message naming the field.
No scheduler configured means a disabled client that passes every call through.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict

from rlslice import env as env_names
from rlslice._errors import InvalidArgumentError
from rlslice._ids import validate_id, validate_seconds
from rlslice.config import MAX_LEASE_SECONDS, TLSConfig

# The variables the client reads when the matching argument is absent (rlslice.env).
ENV_JOB = env_names.JOB
ENV_GROUP = env_names.GROUP
ENV_SCHEDULER = env_names.SCHEDULER
ENV_LEASE_SECONDS = env_names.LEASE_SECONDS
ENV_AGENT_SOCKET = env_names.AGENT_SOCKET
ENV_AGENT_REGISTERED = env_names.AGENT_REGISTERED


class ClientSettings(BaseModel):
    """Everything a client needs to talk to its scheduler, validated.

    A pydantic model like every other component's settings; `resolve_settings` builds it,
    checking each field first so a bad value fails with a one-line message naming it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    scheduler: str | None
    """Scheduler address (`host:port` or `unix:/path`); None disables the client."""
    job: str
    """Job id (empty only when disabled and none was given)."""
    group: str | None
    """Default group for calls that name none."""
    lease_seconds: float
    """Lease asked for at Register; 0 means the group's default."""
    token: str | None
    """Bearer token sent with every call."""
    tls: TLSConfig | None
    """TLS for the channel; None means plaintext (loopback, Unix socket)."""
    priority: int | None
    """Priority sent at Register (priority policy), or None for the group's value."""
    weight: float | None
    """Weight sent at Register (fair policy), or None for the group's value."""
    agent_socket: str | None
    """The local agent's Unix socket to register this process with, or None."""
    device_bytes: int = 0
    """Device bytes the job expects to hold (0 if unknown), sent at Register for capacity checks."""

    @property
    def enabled(self) -> bool:
        """Whether a scheduler is configured."""
        return self.scheduler is not None

    def group_or_default(self, group: str | None) -> str:
        """`group` validated, or the default group; raises when neither is there."""
        if group is None or group == "":
            if self.group is None:
                raise InvalidArgumentError(
                    f"group: none given and no default (pass group= or set {ENV_GROUP})"
                )
            return self.group
        return validate_id(group, "group")


def _env(env: Mapping[str, str], name: str) -> str | None:
    return env_names.value(env, name)


def _token(token: str | None, env: Mapping[str, str]) -> str | None:
    return token or env_names.token_from(env)


def _tls(tls: TLSConfig | None, env: Mapping[str, str]) -> TLSConfig | None:
    return tls if tls is not None else env_names.tls_from(env)


def _lease_seconds(value: float | None, env: Mapping[str, str]) -> float:
    if value is None:
        text = _env(env, ENV_LEASE_SECONDS)
        if text is None:
            return 0.0
        try:
            value = float(text)
        except ValueError:
            raise InvalidArgumentError(f"{ENV_LEASE_SECONDS}: {text!r} is not a number") from None
    return validate_seconds(value, "lease_seconds", minimum=1.0, maximum=MAX_LEASE_SECONDS)


def resolve_settings(
    *,
    job: str | None,
    group: str | None,
    scheduler: str | None,
    lease_seconds: float | None,
    token: str | None,
    tls: TLSConfig | None,
    priority: int | None,
    weight: float | None,
    env: Mapping[str, str],
    device_bytes: int | None = None,
) -> ClientSettings:
    """Validated settings from arguments, falling back to `env` for each absent one."""
    address = scheduler or _env(env, ENV_SCHEDULER)
    job = job or _env(env, ENV_JOB)
    group = group or _env(env, ENV_GROUP)
    if job is not None:
        validate_id(job, "job")
    elif address is not None:
        raise InvalidArgumentError(f"job: none given (pass job= or set {ENV_JOB})")
    if group is not None:
        validate_id(group, "group")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        raise InvalidArgumentError("priority: must be an integer")
    if weight is not None and (
        isinstance(weight, bool)
        or not isinstance(weight, int | float)
        or not math.isfinite(weight)
        or weight <= 0
    ):
        raise InvalidArgumentError(f"weight: must be a positive number, got {weight!r}")
    if device_bytes is not None and (
        isinstance(device_bytes, bool) or not isinstance(device_bytes, int) or device_bytes < 0
    ):
        raise InvalidArgumentError(
            f"device_bytes: must be a non-negative integer, got {device_bytes!r}"
        )
    return ClientSettings(
        scheduler=address,
        job=job or "",
        group=group,
        lease_seconds=_lease_seconds(lease_seconds, env),
        token=_token(token, env),
        tls=_tls(tls, env),
        priority=priority,
        weight=float(weight) if weight is not None else None,
        agent_socket=None if _env(env, ENV_AGENT_REGISTERED) else _env(env, ENV_AGENT_SOCKET),
        device_bytes=device_bytes or 0,
    )
