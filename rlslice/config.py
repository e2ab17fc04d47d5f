"""Typed configuration shared by the components: group specs, TLS and tokens.

Each model converts at the adapter: `GroupSpec.to_proto()` / `GroupSpec.from_proto()` for
the wire, `TLSConfig.server_credentials()` / `channel_credentials()` for grpc. Pure pydantic
otherwise, so the operator, the scheduler and the standalone config file share one schema.
"""

from __future__ import annotations

import enum
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rlslice._ids import validate_id

if TYPE_CHECKING:
    import grpc

    from rlslice.v1alpha1 import scheduler_pb2

MAX_LEASE_SECONDS = 3600.0
DEFAULT_LEASE_SECONDS = 30.0


class Policy(enum.StrEnum):
    """How a group orders its waiters."""

    FIFO = "fifo"
    """First come, first served (the default)."""
    PRIORITY = "priority"
    """Higher priority first, with aging so that nothing starves."""
    FAIR = "fair"
    """Least weighted GPU-seconds held first."""


BACKENDS = ("sim", "cuda", "cuda-checkpoint", "app")


def _finite(value: float, field: str) -> float:
    if not math.isfinite(value):
        raise ValueError(f"{field}: must be finite")
    return value


class JobSpec(BaseModel):
    """A job known to a group ahead of time."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    """Job id, a DNS-1123 label."""
    priority: int = Field(default=0, ge=-1000, le=1000)
    """For the `priority` policy: higher is served first."""
    weight: float = Field(default=1.0, gt=0, le=1000)
    """For the `fair` policy: share of GPU time relative to other jobs."""
    backend: str = ""
    """Overrides the group's backend for this job; empty means the group's."""

    @field_validator("name")
    @classmethod
    def _name_is_label(cls, value: str) -> str:
        return validate_id(value, "name")

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        if value and value not in BACKENDS:
            raise ValueError(f"backend: {value!r} is not one of {', '.join(BACKENDS)}")
        return value


class GroupSpec(BaseModel):
    """A group of GPUs that jobs take turns on, and how it behaves."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    """Group id, a DNS-1123 label."""
    policy: Policy = Policy.FIFO
    """Waiter ordering."""
    lease_seconds: Annotated[float, Field(gt=0, le=MAX_LEASE_SECONDS)] = DEFAULT_LEASE_SECONDS
    """Default lease for jobs that register without one."""
    max_hold_seconds: Annotated[float, Field(ge=0, le=86_400)] = 0.0
    """A holder past this is asked to yield; 0 means no limit."""
    yield_grace_seconds: Annotated[float, Field(ge=0, le=3600)] = 10.0
    """Seconds between asking a holder to yield and preempting it."""
    backend: str = "sim"
    """How agents move device state: sim, cuda, cuda-checkpoint or app."""
    backend_options: dict[str, str] = Field(default_factory=dict)
    """Options passed to the agents' backend as they are."""
    nodes: tuple[str, ...] = ()
    """Nodes whose agents take part in switches; empty means every registered agent."""
    headroom_bytes: Annotated[int, Field(ge=0)] = 0
    """Device bytes kept free on every node when deciding co-residency."""
    jobs: tuple[JobSpec, ...] = ()
    """Jobs known ahead of time."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """Kubernetes node selector the group came from (informational outside Kubernetes)."""

    @field_validator("name")
    @classmethod
    def _name_is_label(cls, value: str) -> str:
        return validate_id(value, "name")

    @field_validator("nodes")
    @classmethod
    def _nodes_are_labels(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for node in value:
            validate_id(node, "nodes[]")
        return value

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        if value not in BACKENDS:
            raise ValueError(f"backend: {value!r} is not one of {', '.join(BACKENDS)}")
        return value

    @field_validator("lease_seconds", "max_hold_seconds", "yield_grace_seconds")
    @classmethod
    def _finite_seconds(cls, value: float) -> float:
        return _finite(value, "seconds")

    def job(self, name: str) -> JobSpec:
        """The spec of job `name`, or the defaults when the group does not list it."""
        for spec in self.jobs:
            if spec.name == name:
                return spec
        return JobSpec(name=name)

    def to_proto(self) -> scheduler_pb2.GroupSpec:
        """The wire form of this spec."""
        from rlslice.v1alpha1 import scheduler_pb2

        return scheduler_pb2.GroupSpec(
            name=self.name,
            policy=_POLICY_TO_PROTO[self.policy],  # type: ignore[arg-type]
            lease_seconds=self.lease_seconds,
            max_hold_seconds=self.max_hold_seconds,
            yield_grace_seconds=self.yield_grace_seconds,
            backend=self.backend,
            backend_options=dict(self.backend_options),
            nodes=list(self.nodes),
            headroom_bytes=self.headroom_bytes,
            jobs=[
                scheduler_pb2.JobSpec(
                    name=j.name, priority=j.priority, weight=j.weight, backend=j.backend
                )
                for j in self.jobs
            ],
            node_selector=dict(self.node_selector),
        )

    @classmethod
    def from_proto(cls, message: scheduler_pb2.GroupSpec) -> GroupSpec:
        """Validate a wire spec; zero values take the defaults. Raises pydantic's ValidationError."""
        defaults = cls.model_fields
        return cls(
            name=message.name,
            policy=_POLICY_FROM_PROTO.get(message.policy, Policy.FIFO),
            lease_seconds=message.lease_seconds or defaults["lease_seconds"].default,
            max_hold_seconds=message.max_hold_seconds,
            yield_grace_seconds=message.yield_grace_seconds
            or defaults["yield_grace_seconds"].default,
            backend=message.backend or "sim",
            backend_options=dict(message.backend_options),
            nodes=tuple(message.nodes),
            headroom_bytes=message.headroom_bytes,
            jobs=tuple(
                JobSpec(
                    name=j.name,
                    priority=j.priority,
                    weight=j.weight or 1.0,
                    backend=j.backend,
                )
                for j in message.jobs
            ),
            node_selector=dict(message.node_selector),
        )


_POLICY_TO_PROTO = {Policy.FIFO: 1, Policy.PRIORITY: 2, Policy.FAIR: 3}
_POLICY_FROM_PROTO = {v: k for k, v in _POLICY_TO_PROTO.items()}


class TLSConfig(BaseModel):
    """TLS for a gRPC endpoint. With `client_ca` set on a server, clients must present a
    certificate signed by it (mutual TLS)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cert: Path | None = None
    """PEM certificate chain of this endpoint (server) or of this client (mutual TLS)."""
    key: Path | None = None
    """PEM private key for `cert`."""
    ca: Path | None = None
    """PEM CA bundle that verifies the peer (a client verifying its server)."""
    client_ca: Path | None = None
    """Server side: PEM CA that client certificates must chain to (turns on mutual TLS)."""
    server_name: str | None = None
    """Client side: overrides the name checked in the server certificate."""

    def server_credentials(self) -> grpc.ServerCredentials:
        """grpc server credentials from the files."""
        import grpc

        if self.cert is None or self.key is None:
            raise ValueError("tls: a server needs both cert and key")
        pair = [(self.key.read_bytes(), self.cert.read_bytes())]
        if self.client_ca is not None:
            return grpc.ssl_server_credentials(
                pair, root_certificates=self.client_ca.read_bytes(), require_client_auth=True
            )
        return grpc.ssl_server_credentials(pair)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """grpc channel credentials from the files."""
        import grpc

        return grpc.ssl_channel_credentials(
            root_certificates=self.ca.read_bytes() if self.ca else None,
            private_key=self.key.read_bytes() if self.key else None,
            certificate_chain=self.cert.read_bytes() if self.cert else None,
        )


def load_group_config(path: Path) -> tuple[GroupSpec, ...]:
    """Group specs from a YAML file: a list of `GroupSpec` mappings, or `{groups: [...]}`
    (`rlslice scheduler --group-config`, `rlslice up --group-config`). Needs pyyaml."""
    import yaml

    data = yaml.safe_load(path.read_text()) or []
    items = data.get("groups", []) if isinstance(data, dict) else data
    return tuple(GroupSpec.model_validate(item) for item in items)
