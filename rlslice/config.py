"""Typed configuration shared by the components: group specs, state parts, TLS and tokens.

Pure pydantic, so the operator, the scheduler and the standalone config file share one
schema. Conversions live at the adapters: `rlslice.adapters.wire` for the protobuf form of a
`GroupSpec`, `rlslice.adapters.channel` for grpc credentials from a `TLSConfig`.
"""

from __future__ import annotations

import enum
import functools
import math
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rlslice._ids import validate_id

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
    LRS = "lrs"
    """Least recently served first: the waiter whose last hold ended longest ago."""
    STAGE = "stage"
    """By phase kind: the waiter whose phase unblocks the most GPU work first, with aging."""


class PhaseKind(enum.StrEnum):
    """What a phase is, declared per phase name in a group spec (`phases`)."""

    ROLLOUT = "rollout"
    """Generation: may be asked to yield early, at a safe point, when a `train` waits."""
    TRAIN = "train"
    """A training step: never asked to yield early."""
    SYNC = "sync"
    """A short weight synchronisation, often across several groups."""


PHASE_KINDS = tuple(kind.value for kind in PhaseKind)
DEFAULT_STAGE_AGING_SECONDS = 300.0
"""A waiter older than this goes first under the `stage` policy (its bound on waiting)."""
MAX_PHASE_NAME_LENGTH = 63


BACKENDS = ("sim", "cuda", "cuda-checkpoint", "app")
"""The backends this distribution ships; plug-ins add theirs through the entry points."""
BACKEND_ENTRY_POINTS = "rlslice.backends"
"""The entry-point group a backend registers in (pyproject `[project.entry-points]`)."""


@functools.cache
def backend_names() -> tuple[str, ...]:
    """Every backend name a spec may use: the shipped ones and each installed plug-in's
    entry point in `rlslice.backends` (read once a process)."""
    from importlib.metadata import entry_points

    plugins = sorted(point.name for point in entry_points(group=BACKEND_ENTRY_POINTS))
    return tuple(dict.fromkeys((*BACKENDS, *plugins)))


def validate_backend(value: str, field: str = "backend") -> str:
    """`value` if it names a known backend; else ValueError naming `field` and the choices.

    The one backend-name rule, for group specs, job specs and agent settings alike."""
    names = backend_names()
    if value not in names:
        raise ValueError(f"{field}: {value!r} is not one of {', '.join(names)}")
    return value


def first_error(error: ValidationError) -> tuple[tuple[str, ...], str]:
    """The first error of `error` as (field path, message), for a one-line refusal.

    pydantic prefixes a validator's ValueError with "Value error, " and our shared
    validators already start with their field's name; both are dropped so the field is
    named once, by the caller, in whatever spelling its surface uses.
    """
    first = error.errors()[0]
    where = tuple(str(part) for part in first["loc"])
    message = str(first["msg"]).removeprefix("Value error, ")
    if where:
        message = message.removeprefix(f"{where[-1]}: ")
    return where, message


def _finite(value: float, field: str) -> float:
    if not math.isfinite(value):
        raise ValueError(f"{field}: must be finite")
    return value


class PhaseSpec(BaseModel):
    """What one phase name of a group is: its kind and how long it usually runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: PhaseKind
    """`rollout` (may be asked to yield early), `train` (never interrupted) or `sync`."""
    expected_seconds: Annotated[float, Field(ge=0, le=86_400)] = 0.0
    """How long the phase usually holds the group, in seconds; 0 means unknown."""

    @field_validator("kind", mode="before")
    @classmethod
    def _known_kind(cls, value: object) -> object:
        if value not in PHASE_KINDS:
            raise ValueError(f"must be one of {', '.join(PHASE_KINDS)}")
        return value

    @field_validator("expected_seconds")
    @classmethod
    def _finite_expected(cls, value: float) -> float:
        return _finite(value, "expected_seconds")


class MoveClass(enum.StrEnum):
    """What a switch may do with one tagged part of a job's device state (issue 26).

    A switch moves only what the incoming job needs, in this order: `discard` parts, then
    `offload` parts, then `keep_if_room` parts (`rlslice.scheduler.core.parts.plan_parts`).
    """

    DISCARD = "discard"
    """Rebuildable (a KV cache, CUDA graphs): freed, never copied; the job rebuilds it."""
    OFFLOAD = "offload"
    """Copied to host memory and restored when the job runs again (the default)."""
    KEEP_IF_ROOM = "keep_if_room"
    """Stays on the device while there is room; copied to host only as the last resort."""


MOVE_CLASSES = tuple(kind.value for kind in MoveClass)
OFFLOAD_TAGS_OPTION = "offload_tags"
"""Backend option of a partial snapshot (issue 26): present, it makes the move partial,
and its value lists the tags to copy to host, comma-separated (the half's `discard_tags`
are freed, every other part stays on the device). Only backends that split parts take it."""
MAX_PART_TAG_LENGTH = 63


class StatePart(BaseModel):
    """One tagged part of a job's device state on one node (the `app` backend's tags:
    `kv_cache`, `optimizer`, `weights`, `adapters`) and what a switch may do with it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tag: str
    """The part's name, unique within its job: printable text of 1 to 63 characters."""
    bytes: Annotated[int, Field(ge=0)]
    """Device bytes the part holds."""
    move_class: MoveClass = MoveClass.OFFLOAD
    """`discard`, `offload` (the default) or `keep_if_room`."""
    need_order: Annotated[int, Field(ge=0)] = 0
    """When the job needs the part once it runs again: 0 (the default) first, higher later.
    Within a move class, the part needed last moves first, as it can come back last."""

    @field_validator("tag")
    @classmethod
    def _printable_tag(cls, value: str) -> str:
        if not value or len(value) > MAX_PART_TAG_LENGTH or not value.isprintable():
            raise ValueError(
                f"tag: {value[:MAX_PART_TAG_LENGTH]!r} must be printable text of 1 to "
                f"{MAX_PART_TAG_LENGTH} characters"
            )
        return value

    @field_validator("move_class", mode="before")
    @classmethod
    def _known_class(cls, value: object) -> object:
        if value not in MOVE_CLASSES:
            raise ValueError(f"move_class: must be one of {', '.join(MOVE_CLASSES)}")
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
    parts: tuple[StatePart, ...] = ()
    """The job's device state on each node as tagged parts (issue 26): a switch away from
    it moves only the parts the incoming job needs room for. Empty: it moves whole."""

    @field_validator("name")
    @classmethod
    def _name_is_label(cls, value: str) -> str:
        return validate_id(value, "name")

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        return validate_backend(value) if value else value

    @field_validator("parts")
    @classmethod
    def _unique_tags(cls, value: tuple[StatePart, ...]) -> tuple[StatePart, ...]:
        seen: set[str] = set()
        for part in value:
            if part.tag in seen:
                raise ValueError(f"parts: tag {part.tag!r} is listed twice")
            seen.add(part.tag)
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
    require_agent_registration: bool = False
    """Refuse the Register of a job no agent of the group knows (its processes never
    registered with their node's agent: nothing of it would move); without it such a job
    is let in, warned and shown as lock only."""
    phases: dict[str, PhaseSpec] = Field(default_factory=dict)
    """Phase name (as `client.phase(name)` says it) -> its kind and expected duration.
    Names not listed behave as they always did: no kind, never asked to yield early."""
    stage_aging_seconds: Annotated[float, Field(gt=0, le=86_400)] = DEFAULT_STAGE_AGING_SECONDS
    """`stage` policy: a waiter that has waited this long goes first (oldest first)."""
    early_yield: bool = True
    """Ask a holder in a `rollout` phase to yield at its next safe point while a `train`
    phase waits (only for phase names declared in `phases`)."""

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
        return validate_backend(value)

    @field_validator("phases")
    @classmethod
    def _phase_names(cls, value: dict[str, PhaseSpec]) -> dict[str, PhaseSpec]:
        for name in value:
            if not name or len(name) > MAX_PHASE_NAME_LENGTH or not name.isprintable():
                raise ValueError(
                    f"phases: {name[:MAX_PHASE_NAME_LENGTH]!r} must be printable text of 1 to "
                    f"{MAX_PHASE_NAME_LENGTH} characters"
                )
        return value

    @field_validator(
        "lease_seconds", "max_hold_seconds", "yield_grace_seconds", "stage_aging_seconds"
    )
    @classmethod
    def _finite_seconds(cls, value: float) -> float:
        return _finite(value, "seconds")

    def phase_kind(self, phase: str) -> PhaseKind | None:
        """The declared kind of phase name `phase`, or None when the spec does not list it."""
        declared = self.phases.get(phase)
        return declared.kind if declared is not None else None

    def job(self, name: str) -> JobSpec:
        """The spec of job `name`, or the defaults when the group does not list it."""
        for spec in self.jobs:
            if spec.name == name:
                return spec
        return JobSpec(name=name)


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


def load_group_config(path: Path) -> tuple[GroupSpec, ...]:
    """Group specs from a YAML file: a list of `GroupSpec` mappings, or `{groups: [...]}`
    (`rlslice scheduler --group-config`, `rlslice up --group-config`). Needs pyyaml.

    A bad spec raises ValueError naming the file and the field, in one line
    (`groups.yaml: groups[0].phases.rollout.kind: must be one of rollout, train, sync`)."""
    import yaml

    data = yaml.safe_load(path.read_text()) or []
    items = data.get("groups", []) if isinstance(data, dict) else data
    specs = []
    for index, item in enumerate(items):
        try:
            specs.append(GroupSpec.model_validate(item))
        except ValidationError as error:  # one line naming the field, as PutGroup's
            where, message = first_error(error)
            raise ValueError(f"{path}: groups[{index}].{'.'.join(where)}: {message}") from None
    return tuple(specs)
