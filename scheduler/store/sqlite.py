"""A store in one SQLite file (WAL, synchronous=NORMAL): for standalone schedulers.

Writes are batched per event-loop iteration: `save_group` records the newest state of the
group and schedules one write (`call_soon`); every state saved during that iteration is
written in one transaction, the newest per group only. In WAL mode with synchronous=NORMAL
a commit appends to the log without an fsync, so a crash of the process loses nothing
committed (a power loss may lose the last few commits). Without a running event loop
(scripts, tests) each save is written at once. The schema carries a version; a file from a
newer build is refused.

A write that fails (a full filesystem, an I/O error) loses nothing: the states are kept and
written again (every half second, and at the next save) until a write succeeds; meanwhile
`error` says why and `commit()` raises `StoreError`, so the scheduler grants nothing it
could not persist (see `SchedulerEngine`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

from rlslice.scheduler.core import GroupState
from rlslice.scheduler.store.base import AgentRecord, Loaded, StoreError
from rlslice.scheduler.store.codec import SCHEMA_VERSION, decode_group, encode_group

log = logging.getLogger(__name__)

#: Seconds between attempts to write states kept after a failed write.
RETRY_SECONDS = 0.5

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS groups (name TEXT PRIMARY KEY, state TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS agents (node TEXT PRIMARY KEY, record TEXT NOT NULL);
"""


class SQLiteStore:
    """Group states and agents in one SQLite file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Autocommit mode: each statement below is its own transaction unless grouped.
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._pending: dict[str, GroupState | None] = {}
        self._scheduled = False
        self._retry: asyncio.TimerHandle | None = None
        self.error: str | None = None
        """Why the last write failed (None once a write succeeds again)."""
        with self._transaction():
            for statement in filter(None, (s.strip() for s in _SCHEMA.split(";"))):
                self._db.execute(statement)
            row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            if row is None:
                self._db.execute(
                    "INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                )
            elif int(row[0]) > SCHEMA_VERSION:
                raise ValueError(
                    f"{self.path}: schema version {row[0]} is newer than this build "
                    f"({SCHEMA_VERSION}); use a newer rlslice"
                )

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One transaction: committed when the block ends, rolled back if it raises."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:  # SQLite may have rolled back by itself (disk full)
                with contextlib.suppress(sqlite3.Error):
                    self._db.execute("ROLLBACK")
            raise

    async def load(self) -> Loaded:
        groups = {
            name: decode_group(json.loads(text))
            for name, text in self._db.execute("SELECT name, state FROM groups")
        }
        agents = {}
        for node, text in self._db.execute("SELECT node, record FROM agents"):
            data = json.loads(text)
            data["backends"] = tuple(data["backends"])
            data["device_total_bytes"] = tuple(data["device_total_bytes"])
            agents[node] = AgentRecord(**data)
        return Loaded(groups, agents)

    def save_group(self, state: GroupState) -> None:
        self._pending[state.name] = state
        self._schedule()

    def delete_group(self, name: str) -> None:
        self._pending[name] = None
        self._schedule()

    def save_agent(self, agent: AgentRecord) -> None:
        text = json.dumps(asdict(agent), separators=(",", ":"))
        self._execute("INSERT OR REPLACE INTO agents VALUES (?, ?)", (agent.node, text))

    def delete_agent(self, node: str) -> None:
        self._execute("DELETE FROM agents WHERE node = ?", (node,))

    def _execute(self, sql: str, args: tuple[str, ...]) -> None:
        try:
            self._db.execute(sql, args)
        except (sqlite3.Error, OSError) as error:
            raise StoreError(f"sqlite {self.path}: {error}") from error

    def commit(self) -> None:
        """Write everything saved so far now; StoreError if it cannot be."""
        self._write()
        if self.error is not None:
            raise StoreError(self.error)

    def _schedule(self) -> None:
        if self._scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._write()
            return
        self._scheduled = True
        loop.call_soon(self._write)

    def _write(self) -> None:
        """Write every pending group state in one transaction. On failure keep them (a
        newer save of a group still wins), note the error and try again soon."""
        self._scheduled = False
        if not self._pending:
            return
        pending, self._pending = self._pending, {}
        try:
            with self._transaction() as db:
                for name, state in pending.items():
                    if state is None:
                        db.execute("DELETE FROM groups WHERE name = ?", (name,))
                    else:
                        text = json.dumps(encode_group(state), separators=(",", ":"))
                        db.execute("INSERT OR REPLACE INTO groups VALUES (?, ?)", (name, text))
        except (sqlite3.Error, OSError) as error:
            self._pending = {**pending, **self._pending}
            if self.error is None:
                log.error("store: writing %s failed: %s; retrying", self.path, error)
            self.error = f"sqlite {self.path}: {error}"
            self._retry_soon()
            return
        if self.error is not None:
            log.warning("store: %s is written again (it failed: %s)", self.path, self.error)
            self.error = None

    def _retry_soon(self) -> None:
        if self._retry is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._retry = loop.call_later(RETRY_SECONDS, self._retried)

    def _retried(self) -> None:
        self._retry = None
        self._write()

    async def flush(self) -> None:
        self._write()

    async def close(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        self._write()
        if self.error is not None:
            log.error("store: closing with states not written: %s", self.error)
        self._db.close()
