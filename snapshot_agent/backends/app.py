"""The `app` backend: the workload offloads itself on the agent's command.

Each process of the job that runs `rlslice.client.offload.serve_offload` keeps a command
stream open to the agent (`LocalAgent.Workload`); the agent hands those streams to this
backend as `JobHandle.workloads`. A snapshot sends OFFLOAD to every stream at once (tags
listed in the `discard_tags` option, comma-separated, are dropped instead of copied where
the workload supports DISCARD); a restore sends RESTORE. Bytes and seconds come from the
workloads' answers.

Failure of any workload (an error, or no answer by the deadline): the workloads that
offloaded, or may have, are told to RESTORE, then BackendError. Restoring a workload that
holds nothing is a no-op on the workload side, so this is safe to repeat.

A job of many ranks (one workload per rank process, on one node or several) moves all its
ranks or none: the error names the rank that failed (`rank R (pid P)`, or `pid P` where
the process has no `RANK`). A rank whose stream this backend saw and which has none now
while its process still runs (its offload loop ended) fails the move before anything is
sent: moving the others alone would park half a job that could run on. A rank whose
process has exited is dropped from the job with a warning and the others move without
it: its state is gone with it, the job's other ranks learn it at their next collective,
and the group goes on. Only the job named is ever commanded.

Parts (issue 26): a workload's tags are the job's parts. A partial snapshot (the
`offload_tags` option present, `OFFLOAD_TAGS_OPTION`) sends every rank the tags it holds of
those to copy and of the discard tags to free; every other tag stays on the device (a
workload that cannot DISCARD copies its discard tags instead). An empty value copies
nothing. A tag named that no workload of the job on this node holds is refused before
anything moves (an options error: its memory would stay on the device while the scheduler
counts it free). The bytes reported are those copied, as `sim` reports them; the restore
brings back only what was parked. In the job, `TorchOffloader` moves by tag; an offloader
that moves whole (vLLM, SGLang, one `MemorySaverOffloader`) moves only when every tag it
holds is named, and refuses, with nothing moved, a partial offload naming some of them:
then the others are restored and the snapshot fails, as any failed offload does.

No privileges, no driver API: torch tensors move to pinned host buffers, vLLM sleeps,
SGLang releases memory. Options (validated models): per move `AppJobOptions`
(`discard_tags`, `fence`, `epoch`; the scheduler's `offload_tags` is read as it is, an
empty value included), agent level `AppOptions` (`rollback_seconds`, 60).

A fencing snapshot (option `fence=1`: the scheduler fences a holder whose lease lapsed,
which may be mid-step) never offloads: an offload under a running step would move tensors
the step is using. The job's processes are stopped (SIGSTOP) and nothing moves; its state
stays on the device. The next restore resumes them (then a RESTORE, a no-op).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from rlslice.config import OFFLOAD_TAGS_OPTION
from rlslice.snapshot_agent.backends import _freeze, _options
from rlslice.snapshot_agent.backends._nvml import Nvml, NvmlUnavailable, known_total
from rlslice.snapshot_agent.backends.base import (
    BackendBase,
    BackendContext,
    BackendError,
    BackendState,
    DeviceUsage,
    JobHandle,
    MoveOutcome,
    OffloadAction,
    OptionsError,
    ProbeResult,
    WorkloadAnswer,
    WorkloadLink,
)

log = logging.getLogger(__name__)

DEFAULT_ROLLBACK_SECONDS = 60.0


class AppJobOptions(BaseModel):
    """What a group (or the scheduler) sets for an `app` job's moves."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    discard_tags: str = ""
    """Tags dropped instead of offloaded at every snapshot, comma-separated (a group can
    drop, say, its KV cache)."""
    fence: bool = False
    """A fencing snapshot ("1", set by the scheduler): stop the processes, move nothing."""
    epoch: Annotated[int, Field(ge=0)] = 0
    """The epoch the workloads are told."""


class AppOptions(BaseModel):
    """The `app` backend's agent-level options."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    rollback_seconds: Annotated[float, Field(ge=0, allow_inf_nan=False)] = DEFAULT_ROLLBACK_SECONDS
    """How long the restore of the workloads that offloaded may take after a failure."""


def discard_tags(job: JobHandle) -> tuple[str, ...]:
    """The snapshot's discard tags, plus the `discard_tags` option (comma-separated: a group
    can drop, say, its KV cache at every snapshot)."""
    raw = _options.parse(AppJobOptions, job.options).discard_tags
    configured = (tag.strip() for tag in raw.split(","))
    return tuple(dict.fromkeys([*job.discard_tags, *(tag for tag in configured if tag)]))


def offload_tags(job: JobHandle) -> tuple[str, ...] | None:
    """A partial snapshot's tags to copy (`OFFLOAD_TAGS_OPTION`; stripped, empty entries
    dropped); None for a whole snapshot."""
    raw = job.options.get(OFFLOAD_TAGS_OPTION)
    if raw is None:  # read here, not through AppJobOptions: an empty value counts too
        return None
    return tuple(dict.fromkeys(tag.strip() for tag in raw.split(",") if tag.strip()))


def _tags_for(link: WorkloadLink, wanted: Sequence[str]) -> list[str]:
    """The discard tags one workload can act on: its own tags, if it supports DISCARD."""
    if "discard" not in link.modes:
        return []  # it will offload those tags instead: contents survive, nothing is lost
    return [tag for tag in wanted if tag in link.tags]


@dataclass(frozen=True)
class _Order:
    """What one workload is told at a snapshot."""

    discard: list[str]
    copy: list[str] | None = None
    """The tags to copy of a partial snapshot; None: a whole one."""


def _order(link: WorkloadLink, wanted: Sequence[str], copy: Sequence[str] | None) -> _Order:
    """One workload's share of a snapshot: its discard tags and, for a partial one, its
    tags to copy (a tag both copied and discarded is copied, as on `sim`; one it cannot
    discard is copied instead)."""
    discard = _tags_for(link, wanted)
    if copy is None:
        return _Order(discard)
    named = [*copy, *([] if "discard" in link.modes else wanted)]
    mine = [tag for tag in dict.fromkeys(named) if tag in link.tags]
    return _Order([tag for tag in discard if tag not in mine], mine)


def _refuse_unheld(job: JobHandle, links: Sequence[WorkloadLink], copy: Sequence[str]) -> None:
    """Refuse a partial snapshot naming a tag no workload of the job here holds: nothing
    would free its memory while the scheduler counts it free."""
    held = {tag for link in links for tag in link.tags}
    unheld = [tag for tag in dict.fromkeys([*copy, *job.discard_tags]) if tag not in held]
    if unheld:
        raise OptionsError(
            f"app: partial snapshot of job {job.job}: no workload of it on this node holds "
            f"{', '.join(unheld)} (they hold {', '.join(sorted(held)) or 'no tag'}); "
            "nothing moved"
        )


class AppBackend(BackendBase):
    """Moves jobs through their workloads' offload streams (see the module docstring)."""

    name: ClassVar[str] = "app"
    needs_workloads: ClassVar[bool] = True
    """The agent lets a just-registered job's stream attach before moving it."""
    splits_parts: ClassVar[bool] = True
    """Takes partial snapshots (`OFFLOAD_TAGS_OPTION`): the workloads move by tag."""

    def __init__(self, context: BackendContext, *, nvml: Nvml | None = None) -> None:
        self._context = context
        self._options = _options.parse(AppOptions, context.options, error=BackendError)
        self._pinned: dict[str, int] = {}
        """Job -> host buffer bytes its workloads said they hold after their last command."""
        self._ranks: dict[str, dict[int, int | None]] = {}
        """Job -> pid -> rank of every workload stream seen for it on this node."""
        self._nvml = nvml if nvml is not None else Nvml()

    async def probe(self) -> ProbeResult:
        return ProbeResult(
            True, "needs no privileges; each job process runs rlslice.client.offload.serve_offload"
        )

    async def _send(
        self,
        links: Sequence[WorkloadLink],
        action: OffloadAction,
        *,
        epoch: int,
        orders: Sequence[_Order],
        deadline: float,
    ) -> list[WorkloadAnswer | BaseException]:
        timeout = max(0.0, deadline - time.time())

        async def one(link: WorkloadLink, order: _Order) -> WorkloadAnswer:
            if timeout <= 0:
                raise TimeoutError("deadline passed before the command was sent")
            if order.copy is None:  # a whole move: what every link has always been sent
                sent = link.command(
                    action, epoch=epoch, discard_tags=order.discard, timeout=timeout
                )
            else:
                sent = link.command(
                    action,
                    epoch=epoch,
                    discard_tags=order.discard,
                    timeout=timeout,
                    offload_tags=order.copy,
                )
            return await asyncio.wait_for(sent, timeout)

        return list(
            await asyncio.gather(
                *(one(link, o) for link, o in zip(links, orders, strict=True)),
                return_exceptions=True,
            )
        )

    @staticmethod
    def _epoch(job: JobHandle) -> int:
        return _options.parse(AppJobOptions, job.options).epoch

    def _links(self, job: JobHandle) -> tuple[WorkloadLink, ...]:
        if not job.workloads:
            raise BackendError(
                f"app: job {job.job} has no workload stream on this node: its processes must "
                "run rlslice.client.offload.serve_offload"
            )
        seen = self._ranks.setdefault(job.job, {})
        streaming = {link.pid for link in job.workloads if link.pid}
        for pid in [pid for pid in seen if pid not in streaming and pid not in job.pids]:
            # Its process is gone, and its state with it: nothing of it can come back, so
            # the job's other ranks move without it (they learn it at their next collective).
            rank = seen.pop(pid)
            log.warning(
                "app: job %s: %s has exited; its other ranks move", job.job, _name(pid, rank)
            )
        lost = sorted(pid for pid in seen if pid not in streaming)
        if lost:
            names = ", ".join(_name(pid, seen[pid]) for pid in lost)
            raise BackendError(
                f"app: job {job.job}: {names} no longer answers (its workload stream is "
                "gone while its process runs): the job's ranks move together or not at all; "
                "nothing moved"
            )
        for link in job.workloads:
            if link.pid:
                seen[link.pid] = link.rank
        return job.workloads

    async def snapshot(self, job: JobHandle, *, deadline: float) -> MoveOutcome:
        start = time.monotonic()
        if _options.parse(AppJobOptions, job.options).fence:  # refused before anything moves
            try:
                await _freeze.stop(job.pids, deadline=deadline)
            except TimeoutError as error:
                raise BackendError(f"app: fence of job {job.job}: {error}") from error
            return MoveOutcome(bytes=0, seconds=time.monotonic() - start)
        links = self._links(job)
        wanted = discard_tags(job)
        copy = offload_tags(job)
        if copy is not None:
            _refuse_unheld(job, links, copy)
        answers = await self._send(
            links,
            OffloadAction.OFFLOAD,
            epoch=self._epoch(job),
            orders=[_order(link, wanted, copy) for link in links],
            deadline=deadline,
        )
        failures = [(i, a) for i, a in enumerate(answers) if _failed(a)]
        if failures:
            # Everything that offloaded, or may have (no answer in time), comes back.
            back = [link for link, a in zip(links, answers, strict=True) if not _refused(a)]
            await self._roll_back(job, back)
            message = _failed_message(job, links, failures, "") + "; others restored"
            log.warning("%s", message)  # the scheduler may retry: the agent's log keeps why
            raise BackendError(message)
        self._note_pinned(job, answers)
        moved = sum(a.bytes for a in answers if isinstance(a, WorkloadAnswer))
        return MoveOutcome(bytes=moved, seconds=time.monotonic() - start)

    def _note_pinned(self, job: JobHandle, answers: Sequence[object]) -> None:
        self._pinned[job.job] = sum(
            a.pinned_bytes for a in answers if isinstance(a, WorkloadAnswer)
        )

    async def held_host_bytes(self, job: JobHandle) -> int:
        """Host buffer bytes the job's workloads hold already (kept pinned staging, reused
        by their next offload): the host-memory guard does not ask for them twice."""
        return self._pinned.get(job.job, 0)

    def pinned_total(self) -> int:
        """Host buffer bytes every job's workloads on this node said they hold."""
        return sum(self._pinned.values())

    async def _roll_back(self, job: JobHandle, links: Sequence[WorkloadLink]) -> None:
        if not links:
            return
        seconds = self._options.rollback_seconds
        answers = await self._send(
            links,
            OffloadAction.RESTORE,
            epoch=self._epoch(job),
            orders=[_Order([]) for _ in links],
            deadline=time.time() + seconds,
        )
        for answer in answers:
            if _failed(answer):
                log.error("app: rollback restore of job %s: %s", job.job, _why(answer))

    async def restore(self, job: JobHandle, *, deadline: float) -> MoveOutcome:
        epoch = self._epoch(job)  # a malformed option is refused before anything moves
        # A fenced job was stopped, not offloaded: it runs on first.
        _freeze.resume(pid for pid in job.pids if _freeze.stopped(pid))
        links = self._links(job)
        start = time.monotonic()
        answers = await self._send(
            links,
            OffloadAction.RESTORE,
            epoch=epoch,
            orders=[_Order([]) for _ in links],
            deadline=deadline,
        )
        failures = [(i, a) for i, a in enumerate(answers) if _failed(a)]
        if failures:
            message = _failed_message(job, links, failures, "restore: ")
            log.warning("%s", message)
            raise BackendError(message)
        self._note_pinned(job, answers)
        moved = sum(a.bytes for a in answers if isinstance(a, WorkloadAnswer))
        return MoveOutcome(bytes=moved, seconds=time.monotonic() - start)

    async def state(self, job: JobHandle) -> BackendState:
        # Only the workloads know, and they are not asked between commands; a RESTORE of a
        # workload that holds nothing is a no-op, so the agent may always send one.
        return BackendState.UNKNOWN

    async def device_bytes(self, job: JobHandle) -> int:
        try:
            return known_total(await self._nvml.aprocess_bytes(job.pids)) or 0
        except NvmlUnavailable:
            return 0

    async def release(self, job: JobHandle) -> int:
        # Parked tensors live in the workload's own pinned buffers, freed with its process.
        self._pinned.pop(job.job, None)
        self._ranks.pop(job.job, None)
        return 0

    async def devices(self) -> Sequence[DeviceUsage]:
        try:
            return await self._nvml.adevices()
        except NvmlUnavailable:
            return []


def _failed(answer: WorkloadAnswer | BaseException) -> bool:
    return isinstance(answer, BaseException) or not answer.ok


def _refused(answer: WorkloadAnswer | BaseException) -> bool:
    """An explicit error answer: the workload says it put itself back (or never moved)."""
    return isinstance(answer, WorkloadAnswer) and not answer.ok


def _why(answer: WorkloadAnswer | BaseException) -> str:
    if isinstance(answer, WorkloadAnswer):
        return answer.error or "failed without a reason"
    if isinstance(answer, TimeoutError):
        return "no answer by the deadline"
    return str(answer) or type(answer).__name__


def _name(pid: int, rank: int | None) -> str:
    """A workload as an error names it: `rank R (pid P)`, or `pid P`."""
    return f"rank {rank} (pid {pid})" if rank is not None else f"pid {pid}"


def _failed_message(
    job: JobHandle,
    links: Sequence[WorkloadLink],
    failures: Sequence[tuple[int, WorkloadAnswer | BaseException]],
    what: str,
) -> str:
    """One line: the first workload that failed, by index and rank, and why."""
    index, answer = failures[0]
    link = links[index]
    who = f" ({_name(link.pid, link.rank)})" if link.pid else ""
    more = f" and {len(failures) - 1} more" if len(failures) > 1 else ""
    return f"app: workload {index} of job {job.job}: {what}{_why(answer)}{who}{more}"
