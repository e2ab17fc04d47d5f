"""`MemorySaverOffloader`: the offload loop driving torch-memory-saver, faked at the library
boundary (its process-wide saver: `pause(tag)`, `resume(tag)`), so no GPU is needed.

Case matrix: OFFLOAD pauses (every region, or one tag), RESTORE resumes, bytes are the
device memory freed and taken back; a repeat does nothing; with CPU backup the regions'
contents survive (OFFLOAD and DISCARD), without it only DISCARD; a pause that fails raises
and leaves the offloader awake, so the agent's rollback finds nothing to resume; driven by
the real app backend through an in-process link; the library missing -> a clear error.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rlslice._errors import FailedPreconditionError
from rlslice.client.offload import MemorySaverOffloader
from rlslice.client.offload._memory_saver import load_saver, preload_path
from rlslice.snapshot_agent.backends.app import AppBackend
from rlslice.snapshot_agent.backends.base import BackendContext, JobHandle

from .test_app_backend import InProcessLink

GiB = 1 << 30


@dataclass
class FakeSaver:
    """torch-memory-saver's `torch_memory_saver` object: regions paused and resumed."""

    used: int = 12 * GiB
    calls: list[tuple[str, str | None]] = field(default_factory=list)
    fail: bool = False

    def pause(self, tag: str | None = None) -> None:
        self.calls.append(("pause", tag))
        if self.fail:
            raise RuntimeError("cuMemUnmap failed")
        self.used = 1 * GiB

    def resume(self, tag: str | None = None) -> None:
        self.calls.append(("resume", tag))
        self.used = 12 * GiB

    def measure(self) -> int:
        return self.used


def test_offload_pauses_restore_resumes_and_bytes_are_measured() -> None:
    saver = FakeSaver()
    offloader = MemorySaverOffloader(saver=saver, measure=saver.measure)
    assert offloader.modes == frozenset({"offload", "discard"})
    assert offloader.offload().bytes == 11 * GiB
    assert offloader.offload().bytes == 0  # a repeat: paused already
    assert offloader.restore().bytes == 11 * GiB
    assert offloader.restore().bytes == 0
    assert saver.calls == [("pause", None), ("resume", None)]


def test_one_tag_and_no_cpu_backup() -> None:
    saver = FakeSaver()
    offloader = MemorySaverOffloader(
        saver=saver, tag="kv_cache", cpu_backup=False, measure=saver.measure
    )
    assert offloader.modes == frozenset({"discard"})
    assert offloader.tags == ("kv_cache",)
    offloader.offload()
    assert saver.calls == [("pause", "kv_cache")]


def test_a_failed_pause_leaves_it_awake() -> None:
    saver = FakeSaver(fail=True)
    offloader = MemorySaverOffloader(saver=saver, measure=saver.measure)
    with pytest.raises(RuntimeError, match="cuMemUnmap"):
        offloader.offload()
    assert offloader.restore().bytes == 0  # nothing to resume
    assert saver.calls == [("pause", None)]


async def test_the_app_backend_moves_a_transparent_job(tmp_path: Path) -> None:
    saver = FakeSaver()
    offloader = MemorySaverOffloader(saver=saver, measure=saver.measure)
    backend = AppBackend(BackendContext(node="n1", state_dir=tmp_path))
    job = JobHandle(job="a", group="g", pids=(), workloads=(InProcessLink(offloader),))
    out = await backend.snapshot(job, deadline=time.time() + 60)
    back = await backend.restore(job, deadline=time.time() + 60)
    assert (out.bytes, back.bytes) == (11 * GiB, 11 * GiB)
    assert [c[0] for c in saver.calls] == ["pause", "resume"]


def test_without_the_library_the_error_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "torch_memory_saver", None)
    monkeypatch.setitem(sys.modules, "torch_memory_saver.utils", None)
    with pytest.raises(FailedPreconditionError, match="pip install torch-memory-saver"):
        load_saver()
    with pytest.raises(FailedPreconditionError, match="pip install torch-memory-saver"):
        preload_path()
    with pytest.raises(FailedPreconditionError, match="torch-memory-saver"):
        MemorySaverOffloader()
