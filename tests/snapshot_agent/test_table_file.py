"""The job table's two slot files (`table_file`): each write goes over the older slot in
place; a read takes the newest whole slot, so a torn or damaged slot falls back to the
table before that write; a table an older agent wrote (`jobs.json`) is read when no slot
exists and removed once a slot is written; slots that are all damaged are an error (the
agent logs it and starts empty), never a silently wrong table."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlslice.snapshot_agent.jobs import JobEntry, JobTable
from rlslice.snapshot_agent.state import AgentJobRecord, JobState
from rlslice.snapshot_agent.table_file import LEGACY_FILE, SLOT_FILES, TableFile


def test_writes_alternate_between_the_slots_and_a_read_takes_the_newest(tmp_path: Path) -> None:
    table = TableFile(tmp_path)
    for payload in ("one", "two", "three"):
        table.write(payload)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(SLOT_FILES)
    assert TableFile(tmp_path).read() == "three"
    assert table.path.read_bytes().endswith(b"\nthree")


def test_a_shorter_payload_over_a_longer_one_reads_back_exactly(tmp_path: Path) -> None:
    table = TableFile(tmp_path)
    table.write("a long first payload")
    table.write("a long second payload")
    table.write("short")  # over the first, in place
    assert TableFile(tmp_path).read() == "short"


@pytest.mark.parametrize(
    "tear",
    [
        lambda data: data[: len(data) - 3],  # the write stopped short
        lambda data: data.replace(b"three", b"thrEe"),  # bytes changed under the checksum
        lambda data: b"",  # created, never written
        lambda data: b"not a slot at all",
    ],
)
def test_a_torn_newest_slot_falls_back_to_the_table_before_it(tmp_path: Path, tear) -> None:
    table = TableFile(tmp_path)
    table.write("two")
    table.write("three")
    table.path.write_bytes(tear(table.path.read_bytes()))
    assert TableFile(tmp_path).read() == "two"


def test_slots_that_are_all_damaged_are_an_error_not_an_empty_table(tmp_path: Path) -> None:
    for name in SLOT_FILES:
        (tmp_path / name).write_bytes(b"rlslice-jobs 1 5 00000000\nhello")
    with pytest.raises(ValueError, match="no whole table"):
        TableFile(tmp_path).read()


def test_an_older_agents_table_is_read_then_removed_once_a_slot_is_written(
    tmp_path: Path,
) -> None:
    legacy = tmp_path / LEGACY_FILE
    record = AgentJobRecord(job="a", group="g", state=JobState.PARKED, epoch=4)
    old = JobTable(tmp_path)
    old.entries["a"] = JobEntry(record)
    legacy.write_text('{"jobs": [' + _entry_json(old.entries["a"]) + "]}")
    table = JobTable(tmp_path)
    table.load()
    assert table.entries["a"].record == record
    with table.change():
        table.entries["a"].record = AgentJobRecord(job="a", group="g", epoch=5)
    assert not legacy.exists()
    reread = JobTable(tmp_path)
    reread.load()
    assert reread.entries["a"].record.epoch == 5


def test_a_restarted_table_continues_the_sequence(tmp_path: Path) -> None:
    first = TableFile(tmp_path)
    first.write("one")
    first.write("two")
    again = TableFile(tmp_path)
    assert again.read() == "two"
    again.write("three")  # over "one", not over "two"
    assert TableFile(tmp_path).read() == "three"
    (tmp_path / again.path.name).write_bytes(b"torn")
    assert TableFile(tmp_path).read() == "two"


def _entry_json(entry: JobEntry) -> str:
    import json

    return json.dumps(entry.to_json())
