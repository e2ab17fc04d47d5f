"""The `cuda-checkpoint` backend over a fake binary on PATH (a Python script that keeps the
processes' states in a JSON file, records every call, and fails or hangs on request).

Case matrix:
- snapshot execs lock (with --timeout) then checkpoint, one pid per exec; restore execs
  restore then unlock; states and bytes as the `cuda` backend.
- a failing checkpoint: restore + unlock for the others, unlock for the failed one.
- a hanging exec is killed at the deadline; the job is rolled back.
- the `binary` agent option names the binary; a group option cannot.
- probe: no binary; a working binary (version and driver in the detail); a binary that
  fails --help.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import rlslice_gpu_fakes as fakes

from rlslice.snapshot_agent.backends._nvml import Nvml
from rlslice.snapshot_agent.backends.base import (
    BackendContext,
    BackendError,
    BackendState,
    JobHandle,
)
from rlslice.snapshot_agent.backends.cuda_checkpoint import CudaCheckpointBackend

GiB = 1 << 30


@pytest.fixture
def binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> fakes.FakeBinary:
    fake = fakes.FakeBinary(tmp_path / "bin", {11: "running", 12: "running"})
    monkeypatch.setenv("PATH", f"{fake.path.parent}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_CC_STATE", str(fake.state_path))
    return fake


def make(tmp_path: Path, fake: fakes.FakeBinary, **options: str) -> CudaCheckpointBackend:
    nvml = fakes.FakeNvml(
        {11: GiB, 12: 2 * GiB}, parked=lambda pid: fake.state_of(pid) == "checkpointed"
    )
    context = BackendContext(node="n1", state_dir=tmp_path / "state", options=options)
    return CudaCheckpointBackend(context, nvml=Nvml(nvml))


def job(**options: str) -> JobHandle:
    return JobHandle(job="job-a", group="g", pids=(11, 12, 4242), options=options)


async def test_a_snapshot_execs_lock_then_checkpoint_per_pid_and_restore_undoes_it(
    tmp_path: Path, binary: fakes.FakeBinary
) -> None:
    backend = make(tmp_path, binary)
    outcome = await backend.snapshot(job(lock_timeout_ms="3000"), deadline=time.time() + 20)
    assert outcome.bytes == 3 * GiB
    assert binary.state_of(11) == "checkpointed"
    assert binary.state_of(12) == "checkpointed"
    calls = binary.calls
    assert sorted(c for c in calls if c[0] == "lock") == [["lock", 11, 3000], ["lock", 12, 3000]]
    assert [c[0] for c in calls][2:] == ["checkpoint", "checkpoint"]
    assert await backend.state(job()) is BackendState.PARKED

    restored = await backend.restore(job(), deadline=time.time() + 20)
    assert restored.bytes == 3 * GiB
    assert [c[0] for c in binary.calls][4:] == ["restore", "restore", "unlock", "unlock"]
    assert await backend.state(job()) is BackendState.RUNNING


async def test_a_failing_checkpoint_unlocks_and_restores_the_others(
    tmp_path: Path, binary: fakes.FakeBinary
) -> None:
    binary.update(fail={"checkpoint:12": "out of host memory"})
    backend = make(tmp_path, binary)
    with pytest.raises(BackendError, match="out of host memory"):
        await backend.snapshot(job(), deadline=time.time() + 20)
    ops = {pid: [c[0] for c in binary.calls if c[1] == pid] for pid in (11, 12)}
    assert ops[11] == ["lock", "checkpoint", "restore", "unlock"]
    assert ops[12] == ["lock", "checkpoint", "unlock"]
    assert binary.state_of(11) == "running"
    assert binary.state_of(12) == "running"


async def test_a_hanging_exec_is_killed_at_the_deadline_and_rolled_back(
    tmp_path: Path, binary: fakes.FakeBinary
) -> None:
    binary.update(hang={"checkpoint:11": 30})
    backend = make(tmp_path, binary)
    start = time.monotonic()
    with pytest.raises(BackendError, match="deadline"):
        await backend.snapshot(job(), deadline=time.time() + 1.5)
    assert time.monotonic() - start < 10
    assert binary.state_of(11) == "running"
    assert binary.state_of(12) == "running"


async def test_the_binary_can_be_named_by_the_agent_but_not_by_a_group(
    tmp_path: Path, binary: fakes.FakeBinary, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    named = make(tmp_path, binary, binary=str(binary.path))
    await named.snapshot(job(), deadline=time.time() + 20)
    assert binary.state_of(11) == "checkpointed"
    unnamed = make(tmp_path, binary)
    with pytest.raises(BackendError, match="no executable cuda-checkpoint"):
        await unnamed.restore(job(binary=str(binary.path)), deadline=time.time() + 20)


async def test_probe_without_the_binary_says_so(
    tmp_path: Path, binary: fakes.FakeBinary, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    result = await make(tmp_path, binary).probe()
    assert not result.usable
    assert "cuda-checkpoint on PATH" in result.detail


async def test_probe_with_the_binary_names_its_version_and_the_driver(
    tmp_path: Path, binary: fakes.FakeBinary
) -> None:
    result = await make(tmp_path, binary).probe()
    assert result.usable, result.detail
    assert "580.65.06" in result.detail


async def test_probe_with_a_broken_binary_says_why(tmp_path: Path) -> None:
    broken = tmp_path / "cuda-checkpoint"
    broken.write_text("#!/bin/sh\necho 'cannot open /dev/nvidiactl' >&2\nexit 3\n")
    broken.chmod(0o755)
    context = BackendContext(node="n1", state_dir=tmp_path, options={"binary": str(broken)})
    result = await CudaCheckpointBackend(context, nvml=Nvml(fakes.FakeNvml({}))).probe()
    assert not result.usable
    assert "/dev/nvidiactl" in result.detail
