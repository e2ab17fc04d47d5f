"""A store in one SQLite file (WAL): for standalone schedulers.

Writes are batched per event-loop iteration: `save_group` records the newest state of the
group and schedules one write (`call_soon`); every state saved during that iteration is
written in one transaction, the newest per group only. Those background writes commit with
synchronous=NORMAL: the log is appended without an fsync, so a crash of the process loses
nothing committed (a power loss may lose the last few). `commit()`, which the scheduler
calls before a grant or a switch takes effect (`commit_now`; `commit` awaits the same),
writes with synchronous=FULL: the log is
fsynced, so what it acknowledges survives a power loss too, and a failing fsync refuses
it. Without a running event loop (scripts, tests) each save is written at once, durably.
The schema carries a version; a file from a newer build is refused.

A write that fails (a full filesystem, an fsync's I/O error) loses nothing: the states are
kept and written again (every half second, and at the next save; durably, so the store
learns that the disk is back from a real fsync) until a write succeeds; meanwhile `error`
says why (`healthy` is False) and `commit_now()` raises `StoreError`, so the scheduler grants nothing it could not
persist (see `SchedulerEngine`). A failed write is undone in the file at once: a failed
fsync leaves the transaction's frames in the log, and a crash before the next commit
would replay them as committed; the rows of the groups it wrote are written back as last
committed (without an fsync, which is what fails), so a restart never finds a refused one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
from collections.abc import Iterable, Iterator, Mapping
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
        self._written: dict[str, str] = {}
        """Each group's row as last committed: what a failed write is undone to."""
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
            elif int(row[0]) < SCHEMA_VERSION:
                # The codec reads the older rows; rows written from now on are this
                # schema's, so an older build must refuse the file.
                self._db.execute(
                    "UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),)
                )
            self._written = dict(self._db.execute("SELECT name, state FROM groups"))

    @contextlib.contextmanager
    def _transaction(self, durable: bool = False) -> Iterator[sqlite3.Connection]:
        """One transaction: committed when the block ends, rolled back if it raises.
        `durable`: the commit fsyncs the log (synchronous=FULL) and fails if that does."""
        self._db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
            self._db.execute("COMMIT")
        except BaseException:
            # SQLite may have rolled back by itself (a full disk, a failed fsync).
            if self._db.in_transaction:
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

    @property
    def healthy(self) -> bool:
        return self.error is None

    def commit_now(self, group: str) -> bool:
        """Write everything saved so far now (`group`'s state with it), fsynced: True, or
        StoreError if it cannot be."""
        self._sync()
        if self.error is not None:
            raise StoreError(self.error)
        return True

    async def commit(self, group: str) -> None:
        self.commit_now(group)

    def _schedule(self) -> None:
        if self._scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._sync()
            return
        self._scheduled = True
        loop.call_soon(self._write)

    def _write(self) -> None:
        """The batched write of an event-loop iteration, or a retry: see `_put`."""
        self._put(durable=False)

    def _sync(self) -> None:
        """Write every pending state now, fsynced: see `_put`."""
        self._put(durable=True)

    def _put(self, durable: bool) -> None:
        """Write every pending group state in one transaction (fsynced when `durable`, or
        while the store is failing). On failure undo it in the file, keep the states (a
        newer save of a group still wins), note the error and try again soon."""
        self._scheduled = False
        if not self._pending:
            return
        pending, self._pending = self._pending, {}
        rows = {
            name: None if state is None else json.dumps(encode_group(state), separators=(",", ":"))
            for name, state in pending.items()
        }
        try:
            with self._transaction(durable or self.error is not None) as db:
                _put_rows(db, rows)
        except (sqlite3.Error, OSError) as error:
            self._pending = {**pending, **self._pending}
            self._undo(rows)
            if self.error is None:
                log.error("store: writing %s failed: %s; retrying", self.path, error)
            self.error = f"sqlite {self.path}: {error}"
            self._retry_soon()
            return
        for name, text in rows.items():
            if text is None:
                self._written.pop(name, None)
            else:
                self._written[name] = text
        if self.error is not None:
            log.warning("store: %s is written again (it failed: %s)", self.path, self.error)
            self.error = None

    def _undo(self, names: Iterable[str]) -> None:
        """Write back the last committed rows of `names`, without an fsync (what failed).
        A failed fsync leaves the failed transaction's frames in the log, and a crash
        before the next commit would replay them; this commit comes first."""
        try:
            with self._transaction() as db:
                _put_rows(db, {name: self._written.get(name) for name in names})
        except (sqlite3.Error, OSError) as error:
            # Writes fail too (a full disk): the failed one's commit frame, written last,
            # did not get into the log either.
            log.debug("store: undoing the failed write of %s failed too: %s", self.path, error)

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
        self._sync()

    async def close(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        self._sync()
        if self.error is not None:
            log.error("store: closing with states not written: %s", self.error)
        self._db.close()


def _put_rows(db: sqlite3.Connection, rows: Mapping[str, str | None]) -> None:
    """Write each group's row (None: no row) in the open transaction."""
    for name, text in rows.items():
        if text is None:
            db.execute("DELETE FROM groups WHERE name = ?", (name,))
        else:
            db.execute("INSERT OR REPLACE INTO groups VALUES (?, ?)", (name, text))
