"""The backend interface: how an agent moves one job's device state on this node.

Backends are found through the `rlslice.backends` entry-point group (name -> class), so a
GPU backend plugs in without touching the agent. The agent owns the per-job state machine,
idempotency by epoch, the host-memory guard and process verification; a backend only moves
bytes for processes the agent has already verified, and reports what it sees.

All methods are async; a backend that blocks (a driver call, an exec) runs it in a thread
and honours `deadline` (seconds since the epoch, `time.time()` clock).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol, runtime_checkable


class BackendState(enum.StrEnum):
    """What a backend can tell about a job's device state on its own (after an agent restart)."""

    RUNNING = "running"
    """Device state on the GPU."""
    PARKED = "parked"
    """Device state in host memory."""
    FAILED = "failed"
    """The backend reports a failed checkpoint/restore."""
    UNKNOWN = "unknown"
    """The backend cannot tell (the caller keeps what it recorded)."""


class OffloadAction(enum.StrEnum):
    """A command to an `app` workload."""

    OFFLOAD = "offload"
    RESTORE = "restore"


@dataclass(frozen=True)
class WorkloadAnswer:
    """A workload's answer to an offload/restore command."""

    ok: bool
    bytes: int = 0
    seconds: float = 0.0
    error: str = ""
    pinned_bytes: int = 0
    """Host buffer bytes the workload holds after the command (parked copy and kept staging)."""


class WorkloadLink(Protocol):
    """The agent's live command stream to one workload process (`app` backend)."""

    modes: frozenset[str]
    """Modes the workload said it supports: "offload", "discard"."""
    tags: tuple[str, ...]
    """Tags the workload offloads by."""
    local_server: tuple[str, int] | None
    """("vllm" | "sglang", port) when the job runs its own local inference server."""
    pid: int
    """The workload's process, from the stream's peer credentials (0: unknown)."""
    rank: int | None
    """Its torch.distributed rank (`RANK` in its environment), None when it has none."""

    async def command(
        self,
        action: OffloadAction,
        *,
        epoch: int,
        discard_tags: Sequence[str],
        timeout: float,
        offload_tags: Sequence[str] | None = None,
    ) -> WorkloadAnswer:
        """Send a command and wait for its answer (raises TimeoutError past `timeout`).

        `offload_tags` (an OFFLOAD only): None moves everything; a sequence makes the
        offload partial: only those tags are copied, `discard_tags` freed, every other tag
        left on the device (empty: copy nothing)."""
        ...


@dataclass(frozen=True)
class JobHandle:
    """One job on this node, as the agent verified it."""

    job: str
    group: str
    pids: tuple[int, ...]
    """Processes the agent verified (peer credentials or discovery), children included."""
    workloads: tuple[WorkloadLink, ...] = ()
    """Open `app` command streams of the job's processes."""
    options: Mapping[str, str] = field(default_factory=dict)
    """Backend options from the group spec."""
    discard_tags: tuple[str, ...] = ()
    """For `app`: tags to drop instead of offloading on this snapshot."""


@dataclass(frozen=True)
class MoveOutcome:
    """What a snapshot or restore did on this node."""

    bytes: int
    """Device bytes moved (for a snapshot, measured before the move)."""
    seconds: float
    """Wall seconds the move took."""


@dataclass(frozen=True)
class DeviceUsage:
    """One device's memory."""

    index: int
    used_bytes: int
    total_bytes: int
    name: str = ""


@dataclass(frozen=True)
class ProbeResult:
    """Whether a backend can work on this node, and why not."""

    usable: bool
    detail: str


@dataclass(frozen=True)
class BackendContext:
    """What the agent hands a backend when it creates it."""

    node: str
    state_dir: Path
    """A private directory the backend may keep files in (survives agent restarts)."""
    options: Mapping[str, str] = field(default_factory=dict)
    """Agent-level options for this backend (from flags or config)."""


class BackendError(Exception):
    """A move failed; the message is one line and says why. The agent rolls back."""


class OptionsError(BackendError):
    """A backend option of the request is malformed. Raised before anything is done, so
    the agent answers INVALID_ARGUMENT and the job's state is as before."""


class DeviceMemoryError(BackendError):
    """A restore found too little free device memory; the job stays parked. The agent
    answers RESOURCE_EXHAUSTED, so the scheduler can evict another job and retry."""


@dataclass(frozen=True)
class SwapOutcome:
    """What one node's half of an overlapped switch did (see `SupportsSwap.swap`)."""

    outgoing: tuple[MoveOutcome, ...]
    """One per outgoing job, in order."""
    incoming: MoveOutcome | None
    overlapped: bool
    """True when incoming bytes were admitted while outgoing bytes were still leaving."""


class SwapError(BackendError):
    """A swap failed and was undone: every outgoing job runs on, the incoming job stays
    parked. `job` and `move` name the half that failed; `cause` is its error."""

    def __init__(self, job: str, move: str, cause: BackendError) -> None:
        super().__init__(str(cause))
        self.job, self.move, self.cause = job, move, cause


@runtime_checkable
class SupportsSwap(Protocol):
    """A backend that overlaps one node's snapshots and restore itself, admitting incoming
    bytes as outgoing bytes leave (the agent runs other backends' halves side by side when
    the incoming job fits beside the outgoing ones, one after the other otherwise)."""

    async def swap(
        self,
        outgoing: Sequence[JobHandle],
        incoming: JobHandle | None,
        *,
        headroom_bytes: int,
        deadline: float,
    ) -> SwapOutcome:
        """Snapshot `outgoing` and restore `incoming` at once, all or nothing: on failure
        undo both halves, then raise SwapError."""
        ...


@runtime_checkable
class SupportsSpill(Protocol):
    """A backend whose parked copies are files in host memory, one per part, that the agent
    may move to its disk tier while the job is parked (`rlslice.snapshot_agent.tiering`).
    The agent puts every part back, byte-identical, before it calls `restore` (or `swap`
    with the job incoming); `release` needs no part back."""

    def parked_jobs(self) -> Sequence[str]:
        """The jobs with a committed parked copy on this node."""
        ...

    def parked_parts(self, job: str) -> Sequence[Path]:
        """Where each part of the job's committed parked copy lives in host memory (empty
        when it has none); a part the agent moved away is listed all the same."""
        ...

    def parked_since(self, job: str) -> float:
        """When the job's parked copy was committed (`time.time()` clock; 0 if unknown)."""
        ...


@runtime_checkable
class Backend(Protocol):
    """Moves device state for verified jobs. Implementations: sim, cuda, cuda-checkpoint, app.

    Besides the moves, a backend declares four optional abilities; `BackendBase` gives
    each its default, so a backend that lacks one says so by inheriting it."""

    name: ClassVar[str]
    needs_workloads: ClassVar[bool]
    """True when moves go through the job's own processes (`app`): the agent lets a
    just-registered job's workload stream attach before it moves the job."""
    splits_parts: ClassVar[bool]
    """True when a snapshot can move only some of a job's tagged parts (`sim`, `app`);
    the agent refuses a partial snapshot to a backend that moves whole processes."""

    def __init__(self, context: BackendContext) -> None: ...

    async def probe(self) -> ProbeResult:
        """Whether this backend works here (driver version, binary on PATH, ...)."""
        ...

    async def device_bytes(self, job: JobHandle) -> int:
        """Device bytes the job holds on this node now (0 when parked or unknown)."""
        ...

    async def snapshot(self, job: JobHandle, *, deadline: float) -> MoveOutcome:
        """Move the job's device state to host memory and stop its GPU work.

        On failure, undo what was done (unlock, restore) before raising BackendError:
        the job must keep running.
        """
        ...

    async def restore(self, job: JobHandle, *, deadline: float) -> MoveOutcome:
        """Bring the job's device state back and let its GPU work continue."""
        ...

    async def state(self, job: JobHandle) -> BackendState:
        """The job's state as the backend sees it, for re-reading after an agent restart."""
        ...

    async def release(self, job: JobHandle) -> int:
        """Drop whatever the backend keeps for the job (parked host copies); bytes freed."""
        ...

    async def devices(self) -> Sequence[DeviceUsage]:
        """Device memory on this node."""
        ...

    async def held_host_bytes(self, job: JobHandle) -> int:
        """Host bytes the job holds already that its next snapshot reuses (kept pinned
        staging): the host-memory guard does not ask for them twice."""
        ...

    def pinned_total(self) -> int:
        """Host buffer bytes this backend's jobs hold pinned on this node (a gauge)."""
        ...


class BackendBase:
    """The defaults of a `Backend`'s optional abilities: no workload streams needed, whole
    jobs moved (no parts), no host bytes held ahead of a snapshot, nothing pinned.
    Backends subclass it and override what they have."""

    needs_workloads: ClassVar[bool] = False
    splits_parts: ClassVar[bool] = False

    async def held_host_bytes(self, job: JobHandle) -> int:
        """None held: a snapshot asks host memory for all its bytes."""
        return 0

    def pinned_total(self) -> int:
        """Nothing pinned."""
        return 0
