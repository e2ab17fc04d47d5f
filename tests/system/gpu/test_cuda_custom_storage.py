"""The `cuda` backend's custom-storage path (CUDA 13.4) over a fake driver with custom storage.

Case matrix:
- snapshot + restore through the ring: bytes identical, every chunk copied once each way,
  slot i mod N reused only after its event was waited on, the driver's sequence (lock,
  checkpoint, complete / restore, complete, unlock), the copy in the store while parked
  and gone after the restore, two GPUs of one process
- a failed chunk mid-snapshot: the process runs again with identical bytes, nothing parked
- a failed rescue copy: said, the operation left open (no abort exists)
- a failed restore chunk: the process parks again, the stored copy intact; a retry restores
- a restart of the agent: the new backend object restores from the store
- which path: driver 580 and a CUDA 13.0 driver take the pageable path; copy=driver keeps it
  on 13.4; copy=custom refuses without custom storage; `rlslice probe` says which and why
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import pytest
import rlslice_gpu_fakes as fakes

from rlslice.snapshot_agent.backends import cuda as cuda_module
from rlslice.snapshot_agent.backends._nvml import Nvml
from rlslice.snapshot_agent.backends.base import BackendContext, BackendError, JobHandle
from rlslice.snapshot_agent.backends.cuda import CudaBackend

CHUNK = 4096
BUFFERS = 3
GiB = 1 << 30


def data(seed: int, size: int) -> bytes:
    return bytes((seed * 31 + i * 7 + (i >> 8)) % 251 for i in range(size))


def make(tmp_path: Path, driver: fakes.FakeDriver, **options: str) -> tuple[CudaBackend, Path]:
    store = tmp_path / "store"
    options = {
        "chunk_bytes": str(CHUNK),
        "ring_buffers": str(BUFFERS),
        "store_dir": str(store),
        **options,
    }
    nvml = fakes.FakeNvml(
        dict.fromkeys(driver.procs, GiB), parked=lambda pid: driver.procs.get(pid) is fakes.C
    )
    context = BackendContext(node="n1", state_dir=tmp_path / "state", options=options)
    backend = CudaBackend(context, driver=driver, nvml=Nvml(nvml), host_memory=lambda: 64 * GiB)
    return backend, store


def job(*pids: int) -> JobHandle:
    return JobHandle(job="job-a", group="g", pids=pids)


def soon() -> float:
    return time.time() + 30


def copies(driver: fakes.FakeCustomDriver, kind: str) -> list[tuple[int, int, int, int, int]]:
    return [entry[1:] for entry in driver.log if entry[0] == kind]


async def test_a_snapshot_and_restore_through_the_ring_bring_back_identical_bytes(
    tmp_path: Path,
) -> None:
    original = [data(1, 10 * CHUNK + 100), data(2, 2 * CHUNK)]  # two GPUs
    driver = fakes.FakeCustomDriver({11: original})
    backend, store = make(tmp_path, driver)
    await backend.snapshot(job(11), deadline=soon())
    assert driver.procs[11] is fakes.C
    assert driver.contents(11) != original  # the device copy is gone: only ours is left
    assert sorted(p.name for p in (store / "11").iterdir()) == ["dev0.bin", "dev1.bin", "meta.json"]
    await backend.restore(job(11), deadline=soon())
    assert driver.contents(11) == original
    assert driver.ops_for(11) == [
        *("lock", "checkpoint", "complete", "restore", "complete", "unlock")
    ]
    assert not (store / "11").exists()  # nothing parked any more
    for kind in ("d2h", "h2d"):
        moved = copies(driver, kind)
        for device, size in enumerate(len(d) for d in original):
            offsets = [offset for _, dev, offset, _, _ in moved if dev == device]
            assert offsets == list(range(0, size, CHUNK))  # every chunk once, in order
            assert sum(n for _, dev, _, n, _ in moved if dev == device) == size


async def test_a_ring_slot_is_reused_only_after_its_last_copy_was_waited_on(
    tmp_path: Path,
) -> None:
    driver = fakes.FakeCustomDriver({11: [data(3, 8 * CHUNK)]})
    backend, _ = make(tmp_path, driver)
    await backend.snapshot(job(11), deadline=soon())
    hosts = [host for *_, host in copies(driver, "d2h")]
    assert len(set(hosts)) == BUFFERS
    assert all(hosts[i] == hosts[i - BUFFERS] for i in range(BUFFERS, len(hosts)))
    events = [entry for entry in driver.log if entry[0] in ("d2h", "record", "wait")]
    recorded: list[object] = [e[1] for e in events if e[0] == "record"]
    slot_event = recorded[:BUFFERS]
    issued = 0
    waited: set[object] = set()
    for entry in events:
        if entry[0] == "wait":
            waited.add(entry[1])
        elif entry[0] == "d2h":
            if issued >= BUFFERS:
                assert slot_event[issued % BUFFERS] in waited  # slot drained first
                waited.discard(slot_event[issued % BUFFERS])
            issued += 1
    # Overlap: chunk 1's copy was issued before chunk 0 was waited on (and stored).
    kinds = [e[0] for e in events]
    assert kinds.index("wait") > [i for i, k in enumerate(kinds) if k == "d2h"][1]


async def test_a_failed_chunk_mid_snapshot_leaves_the_process_running_and_nothing_parked(
    tmp_path: Path,
) -> None:
    original = [data(4, 9 * CHUNK + 5)]
    driver = fakes.FakeCustomDriver({11: original, 12: [data(5, 3 * CHUNK)]})
    driver.fail_copy[5] = fakes.CUresult.CUDA_ERROR_NOT_READY
    backend, store = make(tmp_path, driver, threads="1")
    with pytest.raises(BackendError, match=r"chunk .*CUDA_ERROR_NOT_READY.*copied back"):
        await backend.snapshot(job(11, 12), deadline=soon())
    assert driver.procs == {11: fakes.R, 12: fakes.R}
    assert driver.contents(11) == original
    assert not list(store.iterdir())
    assert not driver.open_ops


async def test_a_failed_rescue_copy_says_the_operation_is_left_open(tmp_path: Path) -> None:
    driver = fakes.FakeCustomDriver({11: [data(6, 6 * CHUNK)]})
    driver.fail_copy[2] = fakes.CUresult.CUDA_ERROR_NOT_READY
    driver.fail_sync_copy = True
    backend, _ = make(tmp_path, driver)
    with pytest.raises(BackendError, match="rescue copy failed too"):
        await backend.snapshot(job(11), deadline=soon())
    assert driver.procs[11] is fakes.CHECKPOINTING  # completing would lose the memory
    assert len(driver.open_ops) == 1


async def test_a_failed_restore_chunk_parks_the_process_again_with_its_copy_intact(
    tmp_path: Path,
) -> None:
    original = [data(7, 7 * CHUNK)]
    driver = fakes.FakeCustomDriver({11: original})
    backend, store = make(tmp_path, driver)
    await backend.snapshot(job(11), deadline=soon())
    stored = (store / "11" / "dev0.bin").read_bytes()
    driver.fail_copy[len(copies(driver, "d2h")) + 4] = fakes.CUresult.CUDA_ERROR_NOT_READY
    with pytest.raises(BackendError, match="parked again, the stored copy is intact"):
        await backend.restore(job(11), deadline=soon())
    assert driver.procs[11] is fakes.C
    assert (store / "11" / "dev0.bin").read_bytes() == stored == original[0]
    await backend.restore(job(11), deadline=soon())
    assert driver.contents(11) == original


async def test_a_restarted_agent_restores_from_the_store(tmp_path: Path) -> None:
    original = [data(8, 5 * CHUNK + 1)]
    driver = fakes.FakeCustomDriver({11: original})
    first, _ = make(tmp_path, driver)
    await first.snapshot(job(11), deadline=soon())
    restarted, _ = make(tmp_path, driver)
    await restarted.restore(job(11), deadline=soon())
    assert driver.contents(11) == original


async def test_release_drops_the_stored_copy_even_after_a_restart(tmp_path: Path) -> None:
    driver = fakes.FakeCustomDriver({11: [data(9, CHUNK)], 12: [data(10, CHUNK)]})
    backend, store = make(tmp_path, driver)
    await backend.snapshot(job(11), deadline=soon())
    await backend.snapshot(job(12), deadline=soon())
    await backend.release(job(11))
    assert not (store / "11").exists()
    restarted, _ = make(tmp_path, driver)
    await restarted.release(job(12))
    assert not (store / "12").exists()


@pytest.mark.parametrize(
    ("driver", "options", "words"),
    [
        (fakes.FakeDriver({11: fakes.R}), {}, "lack cuCheckpointOperationComplete"),
        (
            fakes.FakeCustomDriver({11: [b"x" * CHUNK]}, version=13000),
            {},
            "supports CUDA 13.0; custom storage needs 13.4+",
        ),
        (fakes.FakeCustomDriver({11: [b"x" * CHUNK]}), {"copy": "driver"}, "copy=driver"),
    ],
)
async def test_elsewhere_the_pageable_path_is_taken_and_the_probe_says_why(
    tmp_path: Path, driver: fakes.FakeDriver, options: dict[str, str], words: str
) -> None:
    backend, store = make(tmp_path, driver, **options)
    result = await backend.probe()
    assert result.usable
    assert "pageable staging" in result.detail
    assert words in result.detail
    await backend.snapshot(job(11), deadline=soon())
    assert driver.procs[11] is fakes.C
    assert not store.exists() or not list(store.iterdir())
    assert "complete" not in driver.ops_for(11)


async def test_the_probe_names_the_ring_where_custom_storage_is_offered(tmp_path: Path) -> None:
    backend, _ = make(tmp_path, fakes.FakeCustomDriver({11: [b""]}))
    detail = (await backend.probe()).detail
    assert "the agent's pinned ring through the driver's custom storage (CUDA 13.4)" in detail
    assert "3 x 4.00 KiB buffers per move, node pool limit 1.00 GiB" in detail


async def test_copy_custom_refuses_a_driver_without_custom_storage(tmp_path: Path) -> None:
    backend, _ = make(tmp_path, fakes.FakeDriver({11: fakes.R}), copy="custom")
    result = await backend.probe()
    assert not result.usable
    assert result.detail.startswith("copy=custom, but")
    with pytest.raises(BackendError, match="copy=custom"):
        await backend.snapshot(job(11), deadline=soon())


@pytest.mark.parametrize(("version", "words"), [(12080, "pageable"), (13040, "pinned ring")])
def test_rlslice_probe_says_which_path_the_node_gets(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    version: int,
    words: str,
) -> None:
    from rlslice.apps import probe

    driver = fakes.FakeCustomDriver({}, version=version) if version >= 13040 else fakes.FakeDriver()
    monkeypatch.setattr(cuda_module, "load_driver", lambda: driver)
    monkeypatch.setattr(cuda_module, "Nvml", lambda: Nvml(fakes.FakeNvml({})))
    monkeypatch.setenv("XDG_STATE_HOME", os.fspath(tmp_path))
    probe.run(argparse.Namespace(json=True, node="n1"))
    found = json.loads(capsys.readouterr().out)["cuda"]
    assert found["usable"], found
    assert words in found["detail"]
