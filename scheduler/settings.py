"""`SchedulerSettings`: everything a scheduler needs to start, as one typed object.

The CLI (`rlslice scheduler`), standalone mode (`rlslice up`), the testing kit and the
operator's deployment all build one of these and call `start_scheduler(settings)`.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from rlslice.adapters.auth import Role
from rlslice.adapters.server import check_exposure as check_server_exposure
from rlslice.config import GroupSpec, TLSConfig


class SchedulerSettings(BaseModel):
    """How a scheduler listens, where it keeps state, who may call it, how it switches."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    address: str = "127.0.0.1:50551"
    """gRPC listen address, `host:port` (port 0 picks a free one; see `RunningScheduler.address`)."""
    store: str = "memory"
    """`memory` (nothing survives a restart) or the path of a SQLite file (created if missing)."""
    metrics_port: int | None = None
    """Prometheus HTTP port: None turns metrics serving off, 0 picks a free port."""
    metrics_address: str = "127.0.0.1"
    """Address the metrics HTTP server binds."""
    job_token: str | None = None
    """Bearer token for job methods (Register, Acquire, Yield, reads); None leaves them open."""
    admin_token: str | None = None
    """Bearer token for PutGroup and DeleteGroup; it satisfies every other role too."""
    agent_token: str | None = None
    """Bearer token agents present to RegisterAgent, and the scheduler presents to agents."""
    tls: TLSConfig | None = None
    """TLS for the scheduler's own port (set `client_ca` for mutual TLS)."""
    agent_tls: TLSConfig | None = None
    """TLS for the scheduler's calls to agents (CA to verify them, client cert for mTLS)."""
    auto_create_groups: bool = False
    """Register for an unknown group creates it with default settings (standalone mode);
    otherwise such a Register fails with NOT_FOUND."""
    max_jobs_per_group: Annotated[int, Field(ge=1, le=100_000)] = 256
    """Jobs one group may have at once: a Register beyond it is refused RESOURCE_EXHAUSTED,
    so one job-token holder cannot grow a group past what the store can hold (a Kubernetes
    ConfigMap keeps at most 1 MiB)."""
    max_groups: Annotated[int, Field(ge=1, le=1_000_000)] = 1024
    """Groups a Register may auto-create up to (`auto_create_groups`): once the scheduler
    has this many, a Register for an unknown group is refused RESOURCE_EXHAUSTED."""
    groups: tuple[GroupSpec, ...] = ()
    """Groups created (or replaced) at start."""
    rpc_timeout_seconds: Annotated[float, Field(gt=0, le=3600)] = 60.0
    """Deadline of each Snapshot or Restore call to an agent."""
    status_timeout_seconds: Annotated[float, Field(gt=0, le=600)] = 5.0
    """Deadline of each Status and Release call to an agent."""
    agent_expiry_seconds: Annotated[float, Field(gt=0, le=86_400)] | None = 120.0
    """An agent not heard from (agents re-register every 30 s) for this long is removed
    from the groups that switch through all agents, unless a job's state is on its node;
    None: agents never expire (`rlslice agent remove` still removes one)."""
    agent_retries: Annotated[int, Field(ge=0, le=20)] = 3
    """Retries of an agent call that fails with UNAVAILABLE, with exponential backoff."""
    retry_backoff_seconds: Annotated[float, Field(gt=0, le=60)] = 0.1
    """First backoff between agent call retries; doubles each retry."""
    event_ring_size: Annotated[int, Field(ge=1, le=100_000)] = 128
    """Recent events kept per group for GetEvents and timelines. Each entry keeps the group's
    state after it, so memory grows with groups x this (about 0.5 KiB per entry)."""
    watch_queue_size: Annotated[int, Field(ge=1, le=100_000)] = 1024
    """Events buffered per Watch stream; a watcher that falls further behind is dropped."""
    shutdown_grace_seconds: Annotated[float, Field(ge=0, le=600)] = 5.0
    """On SIGTERM, seconds calls in flight get to finish."""
    allow_unauthenticated: bool = False
    """Serve on an address other hosts can reach with some role open (no token for it, and
    no mutual TLS). Off, such a start fails: anyone on the network could then yield another
    job's group or register a fake agent. Turn on only for a network you trust."""
    host_reserve_bytes: Annotated[int, Field(ge=0)] = 1 << 30
    """Host memory kept free on every node when checking, at Register, that the group's
    parked state fits (a job declaring `device_bytes` that would not fit is refused with
    RESOURCE_EXHAUSTED). Mirrors the agents' own `host_reserve_bytes`."""


def check_exposure(settings: SchedulerSettings) -> None:
    """Refuse to serve beyond this host while any caller could act unauthenticated.

    Every role needs its bearer token, unless mutual TLS already authenticates callers
    (a TLS config with `client_ca`). Loopback addresses are exempt: only this host reaches them.
    """
    tokens = {
        Role.JOB: settings.job_token,
        Role.ADMIN: settings.admin_token,
        Role.AGENT: settings.agent_token,
    }
    check_server_exposure(
        settings.address,
        tokens,
        settings.tls,
        token_flags=TOKEN_FLAGS,
        allow_unauthenticated=settings.allow_unauthenticated,
    )


#: The flag that sets each role's token, named when a role is open.
TOKEN_FLAGS = {
    Role.JOB: "--job-token-file",
    Role.ADMIN: "--admin-token-file",
    Role.AGENT: "--agent-token-file",
}
