"""The disk tier's files (`snapshot_agent.spill`): written and read back identical, or a
clear error naming the file or the directory.

Case matrix:

| case | where | expected |
|---|---|---|
| round trip, sizes 0, 1, a page - 1, several chunks + a tail | a disk folder (O_DIRECT) and tmpfs (buffered: EINVAL) | bytes and CRC-32 identical, length recorded |
| torn file (truncated) | disk | SpillFileError "torn", names the file; no target file |
| damaged file (a byte flipped) | disk | SpillFileError "damaged", names the file |
| missing file | disk | SpillFileError "missing", names the file |
| full disk | a 1 MiB tmpfs mounted for the test (root) | SpillFullError names the directory; nothing left there; source untouched |
| record as JSON | - | from_json(to_json()) is the same record |
"""

from __future__ import annotations

import os
import random
import subprocess
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlslice.snapshot_agent import spill

CHUNK = 64 << 10  # small chunks: several per part, so the pipeline really runs


@pytest.fixture(params=["disk", "tmpfs"])
def spill_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    if request.param == "disk":
        yield tmp_path / "spill"
    else:
        folder = Path("/dev/shm") / f"rlslice-spill-test-{os.getpid()}"
        yield folder
        subprocess.run(["rm", "-rf", str(folder)], check=False)


def part(folder: Path, size: int, seed: int = 1) -> tuple[Path, bytes]:
    folder.mkdir(parents=True, exist_ok=True)
    data = random.Random(seed).randbytes(size)
    path = folder / f"part-{size}.bin"
    path.write_bytes(data)
    return path, data


@pytest.mark.parametrize("size", [0, 1, spill.ALIGN - 1, 5 * CHUNK + 123])
def test_a_spilled_part_reads_back_identical(spill_dir: Path, tmp_path: Path, size: int) -> None:
    source, data = part(tmp_path / "host", size)
    record = spill.write_part(source, spill_dir / "p.bin", chunk=CHUNK)
    assert (record.length, record.crc32) == (size, zlib.crc32(data))
    assert Path(record.file).stat().st_size == size
    assert source.read_bytes() == data  # the source is only read
    back = tmp_path / "host" / "back.bin"
    spill.read_part(record, back, chunk=CHUNK)
    assert back.read_bytes() == data


def spilled(tmp_path: Path, size: int = 3 * CHUNK + 7) -> tuple[spill.SpillRecord, Path]:
    source, _ = part(tmp_path / "host", size)
    record = spill.write_part(source, tmp_path / "spill" / "p.bin", chunk=CHUNK)
    return record, tmp_path / "host" / "back.bin"


def test_a_torn_spill_file_is_refused_naming_it(tmp_path: Path) -> None:
    record, back = spilled(tmp_path)
    os.truncate(record.file, record.length - 100)
    with pytest.raises(spill.SpillFileError, match=f"spill file {record.file} is torn"):
        spill.read_part(record, back, chunk=CHUNK)
    assert not back.exists()
    assert not list(back.parent.glob(".*fill"))


def test_a_longer_spill_file_is_torn_too(tmp_path: Path) -> None:
    record, back = spilled(tmp_path)
    with open(record.file, "ab") as file:
        file.write(b"x" * (2 * CHUNK))
    with pytest.raises(spill.SpillFileError, match="is torn"):
        spill.read_part(record, back, chunk=CHUNK)
    assert not back.exists()


def test_a_damaged_spill_file_is_refused_naming_it(tmp_path: Path) -> None:
    record, back = spilled(tmp_path)
    with open(record.file, "r+b") as file:
        file.seek(CHUNK + 5)
        byte = file.read(1)
        file.seek(CHUNK + 5)
        file.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(spill.SpillFileError, match=f"spill file {record.file} is damaged"):
        spill.read_part(record, back, chunk=CHUNK)
    assert not back.exists()


def test_a_missing_spill_file_is_refused_naming_it(tmp_path: Path) -> None:
    record, back = spilled(tmp_path)
    os.unlink(record.file)
    with pytest.raises(spill.SpillFileError, match=f"spill file {record.file} is missing"):
        spill.read_part(record, back, chunk=CHUNK)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs mounted for the test (root only: skipped elsewhere, failed under CI)."""
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("the full-disk test needs root to mount a tmpfs")
        pytest.skip("needs root to mount a tmpfs")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_refuses_the_spill_naming_the_directory(small_fs: Path, tmp_path: Path) -> None:
    source, data = part(tmp_path / "host", 3 << 20)
    target = small_fs / "job-a" / "p.bin"
    with pytest.raises(spill.SpillFullError, match=f"spill directory {target.parent} is full"):
        spill.write_part(source, target, chunk=CHUNK)
    assert list(target.parent.iterdir()) == []
    assert source.read_bytes() == data


def test_a_record_survives_its_json_form() -> None:
    record = spill.SpillRecord("/x/p.bin", 12, 0xDEADBEEF)
    assert spill.SpillRecord.from_json(record.to_json()) == record
