"""The soak cluster's byte count reads folders the agent is removing at the same moment."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from rlslice.testing import _cluster as _soak_cluster


def test_the_tree_count_sums_every_file_below_the_folder(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "one").write_bytes(b"x" * 3)
    (tmp_path / "a" / "b" / "two").write_bytes(b"y" * 5)
    assert _soak_cluster._tree_bytes(tmp_path) == 8


def test_a_missing_folder_holds_no_bytes(tmp_path: Path) -> None:
    assert _soak_cluster._tree_bytes(tmp_path / "gone") == 0


def test_a_folder_removed_between_listing_and_descent_is_skipped_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The CI failure: a job's folder was listed, then freed by the agent before the walk
    # descended into it. Remove it at exactly that moment, every time.
    (tmp_path / "jobs" / "a" / "chunks").mkdir(parents=True)
    (tmp_path / "jobs" / "a" / "chunks" / "0").write_bytes(b"z" * 7)
    (tmp_path / "jobs" / "keep").write_bytes(b"k" * 2)
    real_scandir = os.scandir

    def scandir_then_free(path: Any) -> Any:
        if isinstance(path, int):  # shutil.rmtree's own walk, by file descriptor
            return real_scandir(path)
        listing = list(real_scandir(path))  # listed while it still exists...
        if Path(path) == tmp_path / "jobs":
            shutil.rmtree(tmp_path / "jobs" / "a")  # ...then freed before the descent

        return _Listing(listing)

    monkeypatch.setattr(os, "scandir", scandir_then_free)
    assert _soak_cluster._tree_bytes(tmp_path / "jobs") == 2
    assert not (tmp_path / "jobs" / "a").exists()  # the race did happen


class _Listing:
    """A finished directory listing shaped like `os.scandir`'s iterator."""

    def __init__(self, entries: list[os.DirEntry[str]]) -> None:
        self._entries = iter(entries)

    def __enter__(self) -> _Listing:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __iter__(self) -> _Listing:
        return self

    def __next__(self) -> os.DirEntry[str]:
        return next(self._entries)
