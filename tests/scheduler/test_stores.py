"""Stores: the codec and the SQLite file.

Cases: a state with every field set (jobs, queue with a detached waiter, resident, parked,
faulted, a switch in flight, preempted) survives encode/decode exactly; the placement is
stored as its jobs in order; a group stored by schema 1 (the placement as three views)
decodes to the same state, from the codec and from an SQLite file (which is then marked
schema 2); a newer schema is refused; SQLite keeps groups and agents across a reopen,
deletes, writes at once without an event loop, and batches saves made in one loop
iteration into one write of the newest state; a file from a newer build is refused; WAL mode is on; both stores satisfy `Store`.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rlslice.config import GroupSpec, JobSpec, Policy
from rlslice.scheduler.core import GroupState, JobRecord, Switch, Waiter
from rlslice.scheduler.core.placement import place
from rlslice.scheduler.store import AgentRecord, MemoryStore, SQLiteStore, Store
from rlslice.scheduler.store.codec import SCHEMA_VERSION, decode_group, encode_group


def _rich_state(epoch: int = 7) -> GroupState:
    spec = GroupSpec(
        name="g",
        policy=Policy.FAIR,
        max_hold_seconds=30,
        nodes=("n1", "n2"),
        backend_options={"rate": "4"},
        jobs=(JobSpec(name="a", weight=2.0),),
    )
    jobs = {
        n: JobRecord(n, f"l{n}", "hash", 30.0, 1e9 + i, priority=i, weight=1.5, device_bytes=9)
        for i, n in enumerate("abcde")
    }
    return GroupState(
        spec=spec,
        jobs=jobs,
        holder=None,
        queue=(Waiter("c", 3, 10.0, "train"), Waiter("d", 4, 11.0, attached=False)),
        placement=place(("e",), ("a",), {"d": "restore failed"}),
        epoch=epoch,
        switch=Switch("b", 5, 9.0, ("e",), ("x",), True, epoch - 1, epoch, 2, 12.0, "e", 3.0),
        yield_requested_at=None,
        preempted=frozenset({"e"}),
        switches=4,
        last_switch_seconds=0.25,
        last_switch_at=12.5,
    )


def test_a_full_state_survives_encode_and_decode() -> None:
    state = _rich_state()
    assert decode_group(encode_group(state)) == state


def test_a_newer_schema_is_refused() -> None:
    data = encode_group(_rich_state())
    data["v"] = 99
    with pytest.raises(ValueError, match="schema version 99"):
        decode_group(data)


def test_the_placement_is_stored_as_its_jobs_in_order() -> None:
    state = replace(_rich_state(), placement=place(("e", "b"), ("a",), {"d": "restore failed"}))
    assert encode_group(state)["placement"] == [
        {"job": "e", "where": "resident", "reason": ""},
        {"job": "b", "where": "resident", "reason": ""},
        {"job": "a", "where": "parked", "reason": ""},
        {"job": "d", "where": "faulted", "reason": "restore failed"},
    ]
    assert decode_group(encode_group(state)).resident == ("e", "b")  # LRU order kept


def _stored_by_schema_1(state: GroupState) -> dict[str, Any]:
    """`_rich_state()` as schema 1 stored it: the placement as its three views."""
    data = {name: value for name, value in encode_group(state).items() if name != "placement"}
    return {**data, "v": 1, "resident": ["e"], "parked": ["a"], "faulted": {"d": "restore failed"}}


def test_a_group_stored_by_schema_1_decodes_to_the_same_state() -> None:
    state = _rich_state()
    assert decode_group(_stored_by_schema_1(state)) == state


def _db_version(path: Path) -> str:
    db = sqlite3.connect(path)
    (value,) = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    db.close()
    return str(value)


async def test_sqlite_loads_a_file_written_by_schema_1_and_marks_it_schema_2(
    tmp_path: Path,
) -> None:
    await SQLiteStore(tmp_path / "s.db").close()
    db = sqlite3.connect(tmp_path / "s.db")
    db.execute("UPDATE meta SET value='1' WHERE key='schema_version'")
    text = json.dumps(_stored_by_schema_1(_rich_state()))
    db.execute("INSERT INTO groups VALUES ('g', ?)", (text,))
    db.commit()
    db.close()
    store = SQLiteStore(tmp_path / "s.db")
    assert (await store.load()).groups == {"g": _rich_state()}
    await store.close()
    # Rows written from now on are schema 2's: the file says so, and an older build refuses it.
    assert _db_version(tmp_path / "s.db") == str(SCHEMA_VERSION) == "2"


async def test_sqlite_keeps_groups_and_agents_across_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = SQLiteStore(path)
    store.save_group(_rich_state())
    store.save_group(GroupState(spec=GroupSpec(name="h")))
    store.save_agent(AgentRecord("n1", "127.0.0.1:9", ("sim",), (1024,), 5, {"zone": "a"}, 1.0))
    store.delete_group("h")
    await store.close()
    again = SQLiteStore(path)
    loaded = await again.load()
    assert loaded.groups == {"g": _rich_state()}
    assert loaded.agents["n1"] == AgentRecord(
        "n1", "127.0.0.1:9", ("sim",), (1024,), 5, {"zone": "a"}, 1.0
    )
    assert again._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    await again.close()


async def test_saves_in_one_loop_iteration_are_one_write_of_the_newest(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    writes = 0
    original = store._write

    def counting() -> None:
        nonlocal writes
        writes += 1
        original()

    store._write = counting  # type: ignore[method-assign]
    for epoch in range(1, 6):
        store.save_group(_rich_state(epoch))
    assert writes == 0
    await asyncio.sleep(0)
    assert writes == 1
    assert (await store.load()).groups["g"].epoch == 5
    await store.close()


def test_without_an_event_loop_a_save_is_written_at_once(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    store.save_group(_rich_state())
    row = sqlite3.connect(tmp_path / "s.db").execute("SELECT name FROM groups").fetchall()
    assert row == [("g",)]


def test_a_file_from_a_newer_build_is_refused(tmp_path: Path) -> None:
    SQLiteStore(tmp_path / "s.db")
    db = sqlite3.connect(tmp_path / "s.db")
    db.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    db.commit()
    with pytest.raises(ValueError, match="newer"):
        SQLiteStore(tmp_path / "s.db")


def test_both_stores_satisfy_the_protocol(tmp_path: Path) -> None:
    assert isinstance(MemoryStore(), Store)
    assert isinstance(SQLiteStore(tmp_path / "s.db"), Store)


async def test_a_store_object_can_be_handed_to_start_scheduler() -> None:
    from rlslice.scheduler import SchedulerSettings, start_scheduler

    store = MemoryStore()
    settings = SchedulerSettings(address="127.0.0.1:0", groups=(GroupSpec(name="g"),))
    first = await start_scheduler(settings, store=store)
    first.engine.register("g", "a", 30, None, None, 0)
    await first.stop(0)
    second = await start_scheduler(settings.model_copy(update={"groups": ()}), store=store)
    assert list(second.engine.groups["g"].state.jobs) == ["a"]
    await second.stop(0)
