"""The `cuda` backend over a fake `cuda.bindings.driver` and a fake NVML.

Case matrix:
- snapshot: lock then checkpoint every CUDA pid; non-CUDA pids skipped; a pid NVML shows
  with memory but the driver does not know is refused; lock timeout = min(option, deadline).
- failure of the Nth driver call (N = 1..6, one worker thread so N is deterministic): the
  exact rollback sequence, every process RUNNING after, BackendError.
- a failed checkpoint that leaves the process CHECKPOINTED is restored too.
- restore: restore then unlock; a failed restore checkpoints again what came back.
- bytes: NVML per-process sum before the snapshot; kept for the restore, across a new
  backend object (agent restart); device delta when NVML has no per-process figure.
- state() from get-state: running, parked, failed, mixed; re-read by a new backend object.
- repeats move nothing; the deadline is honoured (hung call; rollback in background).
- probe: usable, old CUDA, missing symbols, old driver, no cuda-python, no driver (real
  cuda.bindings on this machine).
"""

from __future__ import annotations

import asyncio
import time
from importlib.metadata import entry_points
from pathlib import Path
from types import SimpleNamespace

import pytest
import rlslice_gpu_fakes as fakes

from rlslice.snapshot_agent.backends import cuda as cuda_module
from rlslice.snapshot_agent.backends._nvml import Nvml
from rlslice.snapshot_agent.backends.base import (
    Backend,
    BackendContext,
    BackendError,
    BackendState,
    JobHandle,
)
from rlslice.snapshot_agent.backends.cuda import CudaBackend

R, L, C, F = fakes.R, fakes.L, fakes.C, fakes.F
GiB = 1 << 30
PIDS = (11, 12, 13)


def make(
    tmp_path: Path,
    driver: fakes.FakeDriver,
    memory: dict[int, int | None] | None = None,
    **options: str,
) -> tuple[CudaBackend, fakes.FakeNvml]:
    nvml = fakes.FakeNvml(
        memory if memory is not None else dict.fromkeys(driver.procs, GiB),
        parked=lambda pid: driver.procs.get(pid) is C,
    )
    context = BackendContext(node="n1", state_dir=tmp_path / "state", options=options)
    return CudaBackend(context, driver=driver, nvml=Nvml(nvml)), nvml


def job(pids: tuple[int, ...] = PIDS, **options: str) -> JobHandle:
    return JobHandle(job="job-a", group="g", pids=pids, options=options)


def soon(seconds: float = 10.0) -> float:
    return time.time() + seconds


async def test_a_snapshot_locks_then_checkpoints_every_cuda_process(tmp_path: Path) -> None:
    driver = fakes.FakeDriver(dict.fromkeys(PIDS, R))
    backend, _ = make(tmp_path, driver)
    outcome = await backend.snapshot(job(), deadline=soon())
    assert driver.procs == dict.fromkeys(PIDS, C)
    for pid in PIDS:
        assert driver.ops_for(pid) == ["lock", "checkpoint"]
    ops = [op for op, _ in driver.calls]
    assert ops.index("checkpoint") > max(i for i, op in enumerate(ops) if op == "lock")
    assert outcome.bytes == 3 * GiB
    assert driver.init_calls == 1


async def test_a_restore_restores_then_unlocks_and_reports_the_snapshot_bytes(
    tmp_path: Path,
) -> None:
    driver = fakes.FakeDriver(dict.fromkeys(PIDS, R))
    backend, _ = make(tmp_path, driver)
    await backend.snapshot(job(), deadline=soon())
    outcome = await backend.restore(job(), deadline=soon())
    assert driver.procs == dict.fromkeys(PIDS, R)
    for pid in PIDS:
        assert driver.ops_for(pid) == ["lock", "checkpoint", "restore", "unlock"]
    assert outcome.bytes == 3 * GiB


async def test_processes_without_cuda_are_left_alone(tmp_path: Path) -> None:
    driver = fakes.FakeDriver({11: R})
    backend, _ = make(tmp_path, driver, memory={11: GiB})
    outcome = await backend.snapshot(job((11, 99, 100)), deadline=soon())
    assert driver.procs == {11: C}
    assert {pid for _, pid in driver.calls} == {11}
    assert outcome.bytes == GiB


async def test_a_process_using_memory_that_the_driver_does_not_know_is_refused(
    tmp_path: Path,
) -> None:
    driver = fakes.FakeDriver({11: R})
    backend, _ = make(tmp_path, driver, memory={11: GiB, 99: GiB})
    with pytest.raises(BackendError, match=r"pids \[99\] use GPU memory"):
        await backend.snapshot(job((11, 99)), deadline=soon())
    assert driver.calls == []
    assert driver.procs == {11: R}


@pytest.mark.parametrize(
    ("option", "deadline_s", "expected_low", "expected_high"),
    [("", 30.0, 10_000, 10_000), ("2500", 30.0, 2500, 2500), ("60000", 5.0, 4000, 5000)],
)
async def test_the_lock_timeout_is_the_option_capped_by_the_deadline(
    tmp_path: Path, option: str, deadline_s: float, expected_low: int, expected_high: int
) -> None:
    driver = fakes.FakeDriver({11: R})
    backend, _ = make(tmp_path, driver)
    options = {"lock_timeout_ms": option} if option else {}
    await backend.snapshot(job((11,), **options), deadline=soon(deadline_s))
    assert expected_low <= driver.lock_timeouts[0] <= expected_high


E = fakes.CUresult.CUDA_ERROR_NOT_READY

# Nth driver call fails -> the whole sequence of calls, the failing one included.
ROLLBACKS = {
    1: ["lock 11", "lock 12", "lock 13", "unlock 12", "unlock 13"],
    2: ["lock 11", "lock 12", "lock 13", "unlock 11", "unlock 13"],
    3: ["lock 11", "lock 12", "lock 13", "unlock 11", "unlock 12"],
    4: [
        *("lock 11", "lock 12", "lock 13", "checkpoint 11", "checkpoint 12", "checkpoint 13"),
        *("restore 12", "restore 13", "unlock 12", "unlock 13", "unlock 11"),
    ],
    5: [
        *("lock 11", "lock 12", "lock 13", "checkpoint 11", "checkpoint 12", "checkpoint 13"),
        *("restore 11", "restore 13", "unlock 11", "unlock 13", "unlock 12"),
    ],
    6: [
        *("lock 11", "lock 12", "lock 13", "checkpoint 11", "checkpoint 12", "checkpoint 13"),
        *("restore 11", "restore 12", "unlock 11", "unlock 12", "unlock 13"),
    ],
}


@pytest.mark.parametrize("n", sorted(ROLLBACKS))
async def test_a_failure_of_the_nth_call_rolls_back_in_order(tmp_path: Path, n: int) -> None:
    driver = fakes.FakeDriver(dict.fromkeys(PIDS, R))
    driver.fail_nth[n] = E
    backend, _ = make(tmp_path, driver, threads="1")
    with pytest.raises(BackendError, match="CUDA_ERROR_NOT_READY"):
        await backend.snapshot(job(), deadline=soon())
    assert [f"{op} {pid}" for op, pid in driver.calls] == ROLLBACKS[n]
    assert driver.procs == dict.fromkeys(PIDS, R)
    assert await backend.state(job()) is BackendState.RUNNING


async def test_a_checkpoint_that_fails_after_moving_the_memory_is_restored_too(
    tmp_path: Path,
) -> None:
    driver = fakes.FakeDriver(dict.fromkeys(PIDS, R))
    driver.fail[("checkpoint", 12)] = fakes.CUresult.CUDA_ERROR_ILLEGAL_STATE
    driver.fail_state_after[("checkpoint", 12)] = C
    backend, _ = make(tmp_path, driver)
    with pytest.raises(BackendError, match="checkpoint failed"):
        await backend.snapshot(job(), deadline=soon())
    assert driver.ops_for(12) == ["lock", "checkpoint", "restore", "unlock"]
    assert driver.procs == dict.fromkeys(PIDS, R)


async def test_a_failed_restore_checkpoints_again_what_came_back(tmp_path: Path) -> None:
    driver = fakes.FakeDriver(dict.fromkeys(PIDS, R))
    backend, _ = make(tmp_path, driver)
    await backend.snapshot(job(), deadline=soon())
    driver.fail[("restore", 13)] = E
    with pytest.raises(BackendError, match=r"restore failed.*restore tid 14"):
        await backend.restore(job(), deadline=soon())
    assert driver.procs == dict.fromkeys(PIDS, C)
    assert driver.ops_for(11)[-2:] == ["restore", "checkpoint"]
    assert await backend.state(job()) is BackendState.PARKED
    del driver.fail[("restore", 13)]
    await backend.restore(job(), deadline=soon())
    assert driver.procs == dict.fromkeys(PIDS, R)


async def test_a_new_backend_object_reads_the_true_state_and_the_recorded_bytes(
    tmp_path: Path,
) -> None:
    driver = fakes.FakeDriver(dict.fromkeys(PIDS, R))
    first, _ = make(tmp_path, driver, memory={11: GiB, 12: 2 * GiB, 13: 3 * GiB})
    await first.snapshot(job(), deadline=soon())
    restarted, _ = make(tmp_path, driver, memory={11: GiB, 12: 2 * GiB, 13: 3 * GiB})
    assert await restarted.state(job()) is BackendState.PARKED
    assert await restarted.device_bytes(job()) == 0  # parked processes vanish from NVML
    outcome = await restarted.restore(job(), deadline=soon())
    assert outcome.bytes == 6 * GiB
    assert await restarted.device_bytes(job()) == 6 * GiB


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        ({11: R, 12: R}, BackendState.RUNNING),
        ({11: C, 12: C}, BackendState.PARKED),
        ({11: C, 12: F}, BackendState.FAILED),
        ({11: L, 12: R}, BackendState.UNKNOWN),
        ({}, BackendState.UNKNOWN),
    ],
)
async def test_state_comes_from_the_driver(
    tmp_path: Path, states: dict[int, fakes.CUprocessState], expected: BackendState
) -> None:
    backend, _ = make(tmp_path, fakes.FakeDriver(states))
    assert await backend.state(job((11, 12))) is expected


async def test_without_per_process_figures_the_bytes_are_the_device_delta(tmp_path: Path) -> None:
    driver = fakes.FakeDriver({11: R, 12: R})
    backend, _ = make(tmp_path, driver, memory={11: None, 12: None})
    outcome = await backend.snapshot(job((11, 12)), deadline=soon())
    assert outcome.bytes == 2 * GiB  # the fake counts an unreadable process as 1 GiB


async def test_repeats_move_nothing(tmp_path: Path) -> None:
    driver = fakes.FakeDriver(dict.fromkeys(PIDS, R))
    backend, _ = make(tmp_path, driver)
    await backend.snapshot(job(), deadline=soon())
    calls = len(driver.calls)
    again = await backend.snapshot(job(), deadline=soon())
    assert len(driver.calls) == calls
    assert again.bytes == 3 * GiB
    assert again.seconds == 0.0
    await backend.restore(job(), deadline=soon())
    calls = len(driver.calls)
    assert (await backend.restore(job(), deadline=soon())).bytes == 0
    assert len(driver.calls) == calls


async def test_a_call_hung_past_the_deadline_is_awaited_then_rolled_back(tmp_path: Path) -> None:
    driver = fakes.FakeDriver({11: R, 12: R})
    driver.hang[("checkpoint", 12)] = 0.6
    backend, _ = make(tmp_path, driver)
    start = time.monotonic()
    with pytest.raises(BackendError, match="deadline"):
        await backend.snapshot(job((11, 12)), deadline=soon(0.2))
    assert time.monotonic() - start < 2.0
    assert driver.ops_for(12) == ["lock", "checkpoint", "restore", "unlock"]
    assert driver.procs == {11: R, 12: R}


async def test_a_rollback_longer_than_its_bound_goes_on_in_the_background(tmp_path: Path) -> None:
    driver = fakes.FakeDriver({11: R})
    driver.hang[("checkpoint", 11)] = 0.8
    backend, _ = make(tmp_path, driver, rollback_seconds="0.1")
    start = time.monotonic()
    with pytest.raises(BackendError):
        await backend.snapshot(job((11,)), deadline=soon(0.1))
    assert time.monotonic() - start < 0.6
    for _ in range(100):
        if driver.procs[11] is R:
            break
        await asyncio.sleep(0.05)
    assert driver.ops_for(11) == ["lock", "checkpoint", "restore", "unlock"]
    assert driver.procs[11] is R


async def test_a_bad_option_is_named(tmp_path: Path) -> None:
    backend, _ = make(tmp_path, fakes.FakeDriver({11: R}))
    with pytest.raises(BackendError, match="lock_timeout_ms"):
        await backend.snapshot(job((11,), lock_timeout_ms="soon"), deadline=soon())


async def test_devices_come_from_nvml(tmp_path: Path) -> None:
    backend, _ = make(tmp_path, fakes.FakeDriver({11: R}))
    (device,) = await backend.devices()
    assert device.name == "Fake H200"
    assert device.used_bytes == 2 * GiB


# --- probe ---------------------------------------------------------------------------


async def test_probe_reports_a_usable_driver(tmp_path: Path) -> None:
    backend, _ = make(tmp_path, fakes.FakeDriver())
    result = await backend.probe()
    assert result.usable, result.detail
    assert "580.65.06" in result.detail
    assert "CUDA 12.8" in result.detail


async def test_probe_says_which_copy_path_a_node_gets_and_why(tmp_path: Path) -> None:
    """Driver 580 (CUDA 12.8/13.0): no custom storage, the driver's pageable staging. A CUDA
    13.4 driver whose bindings have the custom-storage calls gets the agent's pinned ring
    (tests/system/gpu/test_cuda_custom_storage.py moves bytes through it)."""
    backend, _ = make(tmp_path, fakes.FakeDriver())
    assert "lack cuCheckpointOperationComplete" in (await backend.probe()).detail
    for version, offered, words in (
        (13000, False, "supports CUDA 13.0; custom storage needs 13.4+"),
        (13040, True, "the agent's pinned ring through the driver's custom storage (CUDA 13.4)"),
    ):
        module = fakes.FakeCustomDriver({}, version=version)
        found, detail = cuda_module.copy_path(module, version)
        assert found is offered
        assert words in detail
        assert ("pageable staging" in detail) is not offered


async def test_probe_refuses_a_driver_older_than_cuda_12_8(tmp_path: Path) -> None:
    backend, _ = make(tmp_path, fakes.FakeDriver(version=12040))
    result = await backend.probe()
    assert not result.usable
    assert "CUDA 12.4" in result.detail
    assert "12.8" in result.detail


async def test_probe_names_missing_symbols(tmp_path: Path) -> None:
    full = fakes.FakeDriver()
    names = [n for n in cuda_module.SYMBOLS if n != "cuCheckpointProcessLock"]
    old = SimpleNamespace(**{name: getattr(full, name) for name in names})
    backend, _ = make(tmp_path, full)
    backend._module = old
    result = await backend.probe()
    assert not result.usable
    assert "cuCheckpointProcessLock" in result.detail


async def test_probe_refuses_a_pre_570_display_driver(tmp_path: Path) -> None:
    driver = fakes.FakeDriver()
    nvml = fakes.FakeNvml({}, driver="560.35.03")
    context = BackendContext(node="n1", state_dir=tmp_path)
    result = await CudaBackend(context, driver=driver, nvml=Nvml(nvml)).probe()
    assert not result.usable
    assert "560.35.03" in result.detail


async def test_probe_without_cuda_python_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def missing() -> None:
        raise ImportError("No module named 'cuda'")

    monkeypatch.setattr(cuda_module, "load_driver", missing)
    result = await CudaBackend(BackendContext(node="n1", state_dir=tmp_path)).probe()
    assert not result.usable
    assert "rlslice[cuda]" in result.detail


async def test_probe_on_this_machine_says_why_not(tmp_path: Path) -> None:
    """The real cuda.bindings: on a machine without a driver the probe says so."""
    if fakes.no_gpu_reason() is None:
        pytest.skip("a GPU driver is present here")
    result = await CudaBackend(BackendContext(node="n1", state_dir=tmp_path)).probe()
    assert not result.usable
    assert result.detail


async def test_the_default_driver_module_is_cuda_bindings_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    driver = fakes.FakeDriver({11: R})
    monkeypatch.setitem(__import__("sys").modules, "cuda.bindings.driver", driver)
    nvml = Nvml(fakes.FakeNvml({11: GiB}, parked=lambda pid: driver.procs[pid] is C))
    backend = CudaBackend(BackendContext(node="n1", state_dir=tmp_path), nvml=nvml)
    await backend.snapshot(job((11,)), deadline=soon())
    assert driver.procs[11] is C


def test_the_backends_are_found_by_entry_point(tmp_path: Path) -> None:
    found = {e.name: e.load() for e in entry_points(group="rlslice.backends")}
    for name in ("cuda", "cuda-checkpoint", "app"):
        cls = found[name]
        assert cls.name == name
        assert isinstance(cls(BackendContext(node="n1", state_dir=tmp_path)), Backend)
