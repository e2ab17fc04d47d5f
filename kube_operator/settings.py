"""The operator's configuration: frozen pydantic models, filled from `rlslice operator` flags."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from rlslice.config import TLSConfig
from rlslice.operator.mutation import InjectionSettings


class WebhookSettings(BaseModel):
    """The pod-mutation webhook server the operator runs (kopf's aiohttp server)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    port: int = 9443
    """Port to listen on; the chart's webhook Service targets it."""
    addr: str = "0.0.0.0"
    """Address to listen on."""
    certfile: Path | None = None
    """PEM certificate the API server verifies (cert-manager's or the chart's)."""
    keyfile: Path | None = None
    """PEM key of `certfile`."""
    insecure: bool = False
    """Plain HTTP (tests only: the API server requires HTTPS)."""


Role = Literal["all", "controller", "webhook"]
"""What one operator process runs: `controller` reconciles TimeSliceGroups (one replica),
`webhook` only serves the pod-mutation webhook (several replicas: it writes nothing),
`all` both in one process (standalone use, tests)."""


class OperatorConfig(BaseModel):
    """Everything the kopf handlers need."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scheduler_address: str
    """Where the operator reaches the scheduler (`host:port`)."""
    injection: InjectionSettings
    """What the webhook injects into labelled pods."""
    admin_token: str | None = None
    """Bearer token for PutGroup/DeleteGroup (role admin)."""
    tls: TLSConfig | None = None
    """TLS to the scheduler; None means plaintext."""
    status_interval: float = 10.0
    """Seconds between status syncs (and drift repairs) of each TimeSliceGroup, and between
    looks at a deleted group's holder."""
    delete_timeout: float = 300.0
    """Seconds a holder gets to yield before a group's deletion is forced."""
    rpc_timeout: float = 10.0
    """Deadline of each scheduler call."""
    webhook: WebhookSettings | None = None
    """The admission webhook server, or None to run without it."""
    role: Role = "all"
    """Which handlers this process registers (see `Role`)."""

    @property
    def reconciles(self) -> bool:
        """Whether this process reconciles TimeSliceGroups (writes to the scheduler)."""
        return self.role in ("all", "controller")

    @property
    def admits(self) -> bool:
        """Whether this process serves the pod-mutation webhook."""
        return self.role in ("all", "webhook") and self.webhook is not None
