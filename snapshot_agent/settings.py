"""The agent's settings: one pydantic model, a docstring per field, converted at the edges."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rlslice import env
from rlslice._ids import validate_id
from rlslice.config import TLSConfig

GiB = 1 << 30


def default_state_dir() -> Path:
    """The user's state directory for rlslice (platformdirs), `agent` inside it."""
    import platformdirs

    return Path(platformdirs.user_state_dir("rlslice")) / "agent"


class SimSettings(BaseModel):
    """The emulated devices of the `sim` backend."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    devices: Annotated[int, Field(ge=1, le=64)] = 1
    """Number of emulated devices on this node."""
    capacity_bytes: Annotated[int, Field(gt=0)] = 16 * GiB
    """Memory of each emulated device, bytes."""
    rate_gbps: Annotated[float, Field(ge=0, le=10_000)] = 25.0
    """Copy rate between device and host, GB/s (1e9 bytes per second); 0 means unlimited."""
    overhead_seconds: Annotated[float, Field(ge=0, le=60)] = 0.0
    """Fixed cost added to every snapshot and restore (driver work, synchronisation)."""
    root: Path = Path(env.DEFAULT_SIM_ROOT)
    """Shared-memory directory holding one folder per node (device memory, parked copies).

    Jobs find it through `RLSLICE_SIM_ROOT` when it is not the default."""

    def to_options(self) -> dict[str, str]:
        """The backend options the `sim` backend reads."""
        return {
            "devices": str(self.devices),
            "capacity_bytes": str(self.capacity_bytes),
            "rate_gbps": repr(self.rate_gbps),
            "overhead_seconds": repr(self.overhead_seconds),
            "root": str(self.root),
        }


class AgentSettings(BaseModel):
    """Everything one snapshot agent needs. Fields map to `rlslice agent` flags."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: str = Field(default_factory=lambda: env.default_node_name())
    """Node name, a DNS-1123 label; defaults to the host name made into one
    (`rlslice.env.default_node_name`, the rule a job's `sim` client follows too)."""
    address: str = "127.0.0.1:0"
    """TCP address of the Agent service, `host:port` (port 0 picks a free one). A
    non-loopback host needs an agent token (mutual TLS alone does not do)."""
    advertise_address: str | None = None
    """Address the scheduler should dial; defaults to `address` with the bound port (and
    the host name in place of an unspecified host such as 0.0.0.0)."""
    socket_path: Path = Field(default_factory=lambda: env.default_agent_socket(os.environ))
    """Unix socket for local registration (LocalAgent). Only jobs on this node reach it;
    the default is `rlslice.env.default_agent_socket`, where jobs look for it too."""
    socket_mode: Annotated[int, Field(ge=0, le=0o777)] = 0o660
    """Permission bits of the Unix socket: 0o660 lets the agent's group register, 0o666
    everyone on the node."""
    state_dir: Path = Field(default_factory=default_state_dir)
    """Directory for the agent's job records and each backend's files; survives restarts."""
    backend: str = "sim"
    """Default backend for jobs that ask for none: sim, cuda, cuda-checkpoint or app."""
    sim: SimSettings = Field(default_factory=SimSettings)
    """Options of the `sim` backend."""
    backend_options: dict[str, dict[str, str]] = Field(default_factory=dict)
    """Options per backend name, passed to the backend as they are (the `sim` entry is
    built from `sim` and overrides nothing here)."""
    host_reserve_bytes: Annotated[int, Field(ge=0)] = 1 * GiB
    """Host memory kept free: a snapshot that would leave less is refused."""
    host_budget_bytes: Annotated[int, Field(gt=0)] | None = None
    """Most bytes of parked state kept in host memory (the `sim` backend's parked copies);
    a park that would exceed it first spills other parked parts to `spill_dir`, least
    recently parked first. None: no budget (only the reserve above limits parking)."""
    spill_dir: Path | None = None
    """The disk tier: a local directory (NVMe, a hostPath on Kubernetes) that parked parts
    spill to when the host budget is short; they survive an agent restart. None: no disk
    tier (a park over the budget is refused)."""
    scheduler: str | None = None
    """Scheduler address (`host:port`) to register with; None for none."""
    scheduler_tls: TLSConfig | None = None
    """TLS for the channel to the scheduler."""
    token: str | None = None
    """Agent token: callers of the Agent service must present it; sent to the scheduler.
    None: the node-local token (`rlslice.adapters.auth.local_agent_token`, a 0600 file of
    this user) stands in; the Agent service is never open."""
    tls: TLSConfig | None = None
    """TLS (mutual with `client_ca`) for the Agent service."""
    metrics_port: Annotated[int, Field(ge=0, le=65535)] | None = None
    """Port for Prometheus metrics on the host of `address` (0 picks one); None: no endpoint."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Node labels reported to the scheduler (for group node selectors)."""

    @field_validator("node")
    @classmethod
    def _node_is_label(cls, value: str) -> str:
        return validate_id(value, "node")

    @field_validator("address")
    @classmethod
    def _address_has_port(cls, value: str) -> str:
        host, _, port = value.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"address: {value!r} is not host:port")
        return value

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        from rlslice.config import validate_backend

        return validate_backend(value)

    def options_for(self, backend: str) -> dict[str, str]:
        """Agent-level options for `backend`."""
        options = dict(self.backend_options.get(backend, {}))
        if backend == "cuda":  # its pinned pool grows only while this reserve stays free
            options.setdefault("host_reserve_bytes", str(self.host_reserve_bytes))
        if backend == "sim":
            options.update(self.sim.to_options())
        return options
