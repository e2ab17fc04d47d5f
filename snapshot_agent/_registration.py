"""Registration: which processes are a job's, their workload streams, and their exits.

A job's processes come from a peer-credential registration on the local socket or, in
Kubernetes mode, from discovery (`adopt`); the engine watches them and frees a job's memory
once the last one exits.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from rlslice._errors import FailedPreconditionError, InvalidArgumentError, PermissionDeniedError
from rlslice._ids import validate_id
from rlslice.snapshot_agent import state
from rlslice.snapshot_agent._engine_core import EngineCore
from rlslice.snapshot_agent.backends.base import BackendError, WorkloadLink
from rlslice.snapshot_agent.discovery import pod_uid_of
from rlslice.snapshot_agent.jobs import JobEntry, LocalJobServer
from rlslice.snapshot_agent.processes import ProcessRef, alive

log = logging.getLogger("rlslice.snapshot_agent.engine")  # the engine's, as before the split


class RegistrationMixin(EngineCore):
    """The engine's registration part: `register`, `adopt`, workload streams, exits."""

    def register(
        self,
        ref: ProcessRef,
        job: str,
        group: str,
        *,
        backend: str = "",
        modes: Sequence[str] = (),
        tags: Sequence[str] = (),
        local_server: LocalJobServer | None = None,
        uid: int | None = None,
    ) -> str:
        """Add the verified process `ref` to `job`; return the backend the job will use.

        `uid` is the caller's uid from the socket's peer credentials: the first registrant
        binds the job to its uid, and a process of another uid (root included) or, where the
        job's processes live in pods, of another pod is refused PERMISSION_DENIED.
        """
        validate_id(job, "job")
        validate_id(group, "group")
        self.backends.require_installed(backend)
        _check_binding(self.table.entries.get(job), job, ref, uid)
        owner = self.table.owner_of(ref)
        if owner is not None and owner.record.job != job:
            raise FailedPreconditionError(
                f"pid {ref.pid} is registered to job {owner.record.job} already"
            )
        entry = self.table.entries.get(job)
        if entry is not None and entry.record.group != group:
            raise FailedPreconditionError(
                f"group: job {job} is registered in group {entry.record.group} on this node"
            )
        with self.table.change():
            if entry is None:
                entry = JobEntry(state.AgentJobRecord(job=job, group=group))
                self.table.entries[job] = entry
            if entry.owner_uid is None:
                entry.owner_uid = uid
            entry.processes.add(ref)
            entry.gone.clear()
            entry.backend = backend or entry.backend
            entry.modes = tuple(modes) or entry.modes
            entry.tags = tuple(tags) or entry.tags
            entry.local_server = local_server or entry.local_server
            self._watcher.watch(ref)
        self._refresh_jobs()
        return entry.backend or self.default_backend

    def adopt(self, found: Mapping[str, tuple[str, frozenset[ProcessRef]]]) -> None:
        """Kubernetes mode: the processes of each discovered job (job -> (group, refs)).

        They come from the job's pods on this node (pod UID -> cgroup -> pid, checked by
        start time), so they count as verified, like a peer-credential registration, and
        they replace whatever registered for those jobs through the socket. A job found
        before and missing now has lost its pods: its processes go, as on an exit.
        """
        changed = False
        with self.table.change():  # written only if something changed
            for job, (group, refs) in found.items():
                entry = self.table.entries.get(job)
                if entry is None:
                    entry = JobEntry(state.AgentJobRecord(job=job, group=group))
                    self.table.entries[job] = entry
                    changed = True
                elif entry.record.group != group:
                    log.warning(
                        "job %s: found in group %s, known in %s", job, group, entry.record.group
                    )
                    continue
                mine = {r for r in refs if self.table.owner_of(r) in (None, entry)}
                changed |= self._set_processes(entry, mine)
            for job in self._discovered - set(found):
                entry = self.table.entries.get(job)
                if entry is not None:
                    changed |= self._set_processes(entry, set())
        self._discovered = set(found)
        if changed:
            self._refresh_jobs()

    def _set_processes(self, entry: JobEntry, refs: set[ProcessRef]) -> bool:
        if refs == entry.processes:
            return False
        for ref in entry.processes - refs:
            self._watcher.forget(ref)
        for ref in refs - entry.processes:
            self._watcher.watch(ref)
        entry.processes = set(refs)
        if not refs:
            entry.gone.set()
            self._spawn(self._drop_if_gone(entry))
        else:
            entry.gone.clear()
        return True

    def attach_workload(self, job: str, link: WorkloadLink) -> None:
        """Add an open workload stream to a registered job."""
        entry = self.table.entries[job]
        entry.workloads.append(link)
        entry.streams_ended = False
        entry.attached.set()

    def detach_workload(self, job: str, link: WorkloadLink) -> None:
        """Remove a closed workload stream."""
        entry = self.table.entries.get(job)
        if entry is not None and link in entry.workloads:
            entry.workloads.remove(link)
            if not entry.workloads:
                entry.attached.clear()
                entry.streams_ended = True

    def _on_exit(self, ref: ProcessRef) -> None:
        entry = self.table.owner_of(ref)
        if entry is None:
            return
        with self.table.change():
            entry.processes.discard(ref)
        self._watcher.forget(ref)
        log.info("job %s: process %d exited", entry.record.job, ref.pid)
        if not entry.processes:
            entry.gone.set()
            self._spawn(self._drop_if_gone(entry))

    async def _drop_if_gone(self, entry: JobEntry) -> None:
        async with entry.lock:
            if entry.processes or not (entry.record.state_on_device or entry.released):
                return  # parked state stays until the scheduler releases it
            if self.table.entries.get(entry.record.job) is not entry:
                return
            try:
                backend = await self.backend(self.backends.serving(entry))
                with self.table.change():
                    await self._drop(entry, backend)
            except (FailedPreconditionError, InvalidArgumentError, BackendError) as error:
                log.warning("job %s: could not free its memory: %s", entry.record.job, error)


def _check_binding(entry: JobEntry | None, job: str, ref: ProcessRef, uid: int | None) -> None:
    """Refuse a registrant that is not the job's: another uid than the one that first
    registered it, or (when the job's live processes are in pods) a process of another pod.
    Root gets no exemption: uid 0 in a container is not the node's administrator."""
    if entry is None:
        return
    if uid is not None and entry.owner_uid is not None and uid != entry.owner_uid:
        raise PermissionDeniedError(
            f"job {job} is registered on this node by uid {entry.owner_uid}, not uid {uid}"
        )
    pods = {pod_uid_of(p.cgroup) for p in entry.processes if alive(p)} - {None}
    if pods and pod_uid_of(ref.cgroup) not in pods:
        raise PermissionDeniedError(f"job {job} is registered on this node from other pods")
