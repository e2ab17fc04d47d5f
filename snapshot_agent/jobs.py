"""The agent's table of jobs on this node, kept in a JSON file that survives restarts.

Each entry holds the job's pure record (`state.AgentJobRecord`, whether it was released
included), the processes the agent verified for it, what the job said when it registered,
and its open workload streams. The table is written whole at the end of every unit of
work (`JobTable.change`), into the older of two slot files (`table_file`), so a crash
leaves it before or after the unit; the workload streams are not kept (a restarted agent
waits for the workloads to reconnect).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlslice.snapshot_agent.backends.base import WorkloadLink
from rlslice.snapshot_agent.processes import ProcessRef
from rlslice.snapshot_agent.state import AgentJobRecord, from_dict, release_kept, to_dict
from rlslice.snapshot_agent.table_file import TableFile

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalJobServer:
    """A job's own local inference server (`app` backend with vLLM or SGLang)."""

    kind: str
    port: int


@dataclass
class JobEntry:
    """One job on this node (mutable: the adapter's container around the pure record)."""

    record: AgentJobRecord
    processes: set[ProcessRef] = field(default_factory=set)
    backend: str = ""
    """Backend the job asked for at registration; empty means the agent's default."""
    modes: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    local_server: LocalJobServer | None = None
    owner_uid: int | None = None
    """The uid that first registered the job through the socket (peer credentials); a
    Register of this job from another uid is refused. None: adopted from its pods
    (Kubernetes mode) or recorded by an older agent; the next registrant binds it."""
    workloads: list[WorkloadLink] = field(default_factory=list)
    attached: asyncio.Event = field(default_factory=asyncio.Event)
    """Set while at least one workload stream is open."""
    streams_ended: bool = False
    """The job's last workload stream closed in this agent's life (its offload loop ended:
    the job is leaving); a move does not wait for a stream to come back."""
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once every process of the job has exited (cleared when one registers): a move
    waiting for the job's stream stops waiting."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held while the job moves: moves of one job run one at a time."""

    @property
    def released(self) -> bool:
        """Whether the scheduler released the job while its processes lived (the record's
        `released`)."""
        return self.record.released

    def to_json(self) -> dict[str, Any]:
        return {
            "record": to_dict(self.record),
            "processes": [
                [p.pid, p.start, p.cgroup] for p in sorted(self.processes, key=lambda p: p.pid)
            ],
            "backend": self.backend,
            "modes": list(self.modes),
            "tags": list(self.tags),
            "local_server": None
            if self.local_server is None
            else [self.local_server.kind, self.local_server.port],
            "owner_uid": self.owner_uid,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobEntry:
        server = data.get("local_server")
        record = from_dict(data["record"])
        if data.get("released"):  # written by an agent that kept the flag beside the record
            record = release_kept(record)
        return cls(
            record=record,
            processes={
                ProcessRef(int(item[0]), float(item[1]), str(item[2]) if len(item) > 2 else "")
                for item in data["processes"]
            },
            backend=str(data.get("backend", "")),
            modes=tuple(data.get("modes", ())),
            tags=tuple(data.get("tags", ())),
            local_server=None if not server else LocalJobServer(str(server[0]), int(server[1])),
            owner_uid=None if data.get("owner_uid") is None else int(data["owner_uid"]),
        )


class JobTable:
    """Jobs by id, persisted to `<state_dir>/jobs.0|jobs.1` (see `table_file`)."""

    def __init__(self, state_dir: Path) -> None:
        self._file = TableFile(state_dir)
        self.entries: dict[str, JobEntry] = {}
        self._written: str | None = None  # the payload last written, None before the first

    def load(self) -> None:
        """Read the file; a damaged entry is logged and skipped, never fatal."""
        where = self._file.state_dir
        try:
            payload = self._file.read()
            if payload is None:
                return
            data = json.loads(payload)
        except (OSError, ValueError) as error:
            log.error("cannot read the job table in %s (%s): starting with no jobs", where, error)
            return
        for item in data.get("jobs", []):
            try:
                entry = JobEntry.from_json(item)
            except (KeyError, ValueError, TypeError) as error:
                log.error("skipping a damaged job entry in %s: %s", where, error)
                continue
            self.entries[entry.record.job] = entry

    @contextlib.contextmanager
    def change(self) -> Iterator[None]:
        """One unit of work on the table, and the only way to write its file.

        Whatever the block changes is written once, atomically, as the block ends, whether
        it ends normally or by an exception (a rollback is written like a success), so a
        crash leaves the file as it was before the unit or after it, never in between.
        Units do not nest: an operation that must be on disk before it goes on (a move's
        SAVING or RESTORING record, so that a restart knows it was under way) is a unit
        of its own."""
        try:
            yield
        finally:
            self._write()

    def _write(self) -> None:
        payload = json.dumps({"jobs": [entry.to_json() for entry in self.entries.values()]})
        if payload == self._written:
            return  # nothing changed since the last write
        self._file.write(payload)
        self._written = payload

    @property
    def path(self) -> Path:
        """The file holding the table as last read or written."""
        return self._file.path

    def owner_of(self, ref: ProcessRef) -> JobEntry | None:
        """The job `ref` is registered to, if any."""
        for entry in self.entries.values():
            if ref in entry.processes:
                return entry
        return None
