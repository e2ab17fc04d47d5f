"""`rlslice bench switch`, the `partial` section, scaled down (issue 26): two sim jobs of
which only 25% must move, through a real scheduler and agent, moved with their parts
declared and without, side by side. The partial switches move one part of four (plus the
parked part back): moved_ratio 0.25, within the 0.30 target, and every job's bytes stay
identical across its turns. The serial calls (Snapshot, then Restore) move the same."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlslice.apps.bench._switch_partial import PARTIAL_TARGET, partial_vs_whole

MiB = 1 << 20


@pytest.fixture
def folders() -> Iterator[tuple[Path, Path]]:
    """The emulated devices' root (shared memory) and a short folder for the sockets."""
    root = Path(
        tempfile.mkdtemp(
            prefix="rlslice-test-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
        )
    )
    work = Path(tempfile.mkdtemp(prefix="rp-", dir="/tmp"))
    yield root, work
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)


def test_partial_switches_move_a_quarter_of_what_whole_switches_move(
    folders: tuple[Path, Path],
) -> None:
    result = asyncio.run(partial_vs_whole(1 << 30, 256.0, 0.0, 2, *folders))
    assert result["real_bytes"] == 4 * MiB
    assert result["whole_moved_bytes"] == 2 * 2 * 4 * MiB  # two turns, each job out and in
    assert result["partial_moved_bytes"] == 2 * 2 * MiB  # one 1 MiB part out, one back
    assert result["moved_ratio"] == 0.25
    assert result["moved_ratio"] <= PARTIAL_TARGET
    assert result["meets_target"] is True
    assert result["identical"] is True


def test_serial_switches_move_the_same_parts(
    folders: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlslice.scheduler.coordinator import Coordinator

    monkeypatch.setattr(Coordinator, "_overlapped", Coordinator._serial)  # Snapshot, Restore
    result = asyncio.run(partial_vs_whole(1 << 30, 256.0, 0.0, 2, *folders))
    assert result["partial_moved_bytes"] == 2 * 2 * MiB
    assert result["moved_ratio"] == 0.25
    assert result["identical"] is True
