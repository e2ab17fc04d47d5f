"""The swap bench, and the backends on a real GPU.

Here (no GPU): `rlslice bench swap` refuses with a clear message, and its plumbing runs on
CPU torch (`--cpu`, app backend): two workers swapped through the real `AppBackend`, losses
bit-identical to each job run alone.

Marked `gpu` (skip themselves unless cuda.bindings reaches a driver and a GPU):
- `TorchOffloader` on CUDA: device memory given back, values bit-identical, pinned buffers.
- `CudaBackend` on a child process holding a CUDA tensor: PARKED by get-state, gone from
  NVML, restored with its values; bytes from NVML.
- the bench, small, for the app and cuda backends.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import rlslice_gpu_fakes as fakes

RLSLICE = [sys.executable, "-m", "rlslice.apps"]
ENV = {**os.environ, "PYTHONSAFEPATH": "1"}


def bench(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RLSLICE, "bench", "swap", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
        check=False,
    )


def test_the_swap_bench_without_a_gpu_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    if fakes.no_gpu_reason() is None:
        pytest.skip("a GPU is present here")
    pytest.importorskip("torch")
    from rlslice.apps.bench import swap

    parser = argparse.ArgumentParser()
    swap.configure(parser)
    args = parser.parse_args(["--backend", "cuda", "--gib", "1"])
    args.json = True
    assert swap.run(args) == 2
    assert "needs an NVIDIA GPU" in json.loads(capsys.readouterr().err)["error"]


@pytest.mark.slow
def test_the_swap_bench_plumbing_keeps_losses_bit_identical_on_cpu() -> None:
    pytest.importorskip("torch")
    result = bench("--cpu", "--gib", "0.002", "--swaps", "2", "--steps", "2", "--json")
    assert result.returncode in (0, 1), result.stderr
    report = json.loads(result.stdout)
    assert report["bit_identical"] == {"a": True, "b": True}, report.get("first_difference")
    assert report["losses_compared"] == {"a": 4, "b": 2}
    assert report["snapshot_d2h"]["bytes"] > 0.002 * (1 << 30) * 0.9
    assert len(report["snapshot_d2h"]["seconds_all"]) == 3  # park b, then two swaps
    assert report["targets"]["bit_identical"] is True


@pytest.mark.slow
def test_overlapped_switches_in_the_swap_bench_keep_losses_bit_identical_on_cpu() -> None:
    pytest.importorskip("torch")
    result = bench("--cpu", "--gib", "0.002", "--swaps", "2", "--steps", "2", "--overlap", "--json")
    assert result.returncode in (0, 1), result.stderr
    report = json.loads(result.stdout)
    assert report["bit_identical"] == {"a": True, "b": True}, report.get("first_difference")
    assert report["losses_compared"] == {"a": 6, "b": 4}  # 2 serial + 2 overlapped switches
    assert len(report["overlapped_switch"]["seconds_all"]) == 2
    assert "overlapped_within_1.2x_max_memcpy_plus_50ms" in report["targets"]


# --- on a real GPU ------------------------------------------------------------------------


@pytest.mark.gpu
def test_the_torch_offloader_gives_device_memory_back_on_a_gpu() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    from rlslice.client.offload import TorchOffloader

    model = torch.nn.Linear(4096, 4096).cuda()
    state = torch.randn(64 << 20, device="cuda")  # 256 MiB
    saved = (model.weight.detach().clone(), state.clone())
    offloader = TorchOffloader()
    offloader.register(model, "weights")
    offloader.register(state, "state")
    before = torch.cuda.memory_reserved()
    out = offloader.offload()
    assert out.bytes >= state.numel() * 4
    assert torch.cuda.memory_reserved() <= before - state.numel() * 4
    back = offloader.restore()
    assert back.bytes == out.bytes
    assert torch.equal(model.weight, saved[0])
    assert torch.equal(state, saved[1])


TRANSPARENT_CHILD = """
import torch
from torch_memory_saver import torch_memory_saver
from rlslice.client.offload import MemorySaverOffloader
with torch_memory_saver.region(enable_cpu_backup=True):
    x = torch.randn(64 << 20, device="cuda", generator=torch.Generator("cuda").manual_seed(7))
expected = x.double().sum().item()
torch.cuda.synchronize()
offloader = MemorySaverOffloader()
out = offloader.offload()
back = offloader.restore()
same = x.double().sum().item() == expected
print(out.bytes, back.bytes, "same" if same else "changed", flush=True)
"""


@pytest.mark.gpu
def test_the_transparent_path_parks_a_region_and_brings_the_same_bytes_back() -> None:
    """Needs torch-memory-saver installed (the child preloads its hook library)."""
    pytest.importorskip("torch")
    pytest.importorskip("torch_memory_saver")
    from rlslice.client.offload._memory_saver import preload_path

    env = {**os.environ, "LD_PRELOAD": preload_path()}
    done = subprocess.run(
        [sys.executable, "-c", TRANSPARENT_CHILD],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out, back, verdict = done.stdout.split()
    assert int(out) >= 200 << 20  # the 256 MiB region left the device (NVML)
    assert int(back) >= 200 << 20
    assert verdict == "same"


CHILD = """
import sys, torch
x = torch.randn(128 << 20, device="cuda", generator=torch.Generator("cuda").manual_seed(7))
expected = x.double().sum().item()
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.readline()
print("same" if x.double().sum().item() == expected else "changed", flush=True)
"""


@pytest.mark.gpu
async def test_the_cuda_backend_parks_and_restores_a_real_process(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from rlslice.snapshot_agent.backends.base import BackendContext, BackendState, JobHandle
    from rlslice.snapshot_agent.backends.cuda import CudaBackend

    backend = CudaBackend(BackendContext(node="n1", state_dir=tmp_path))
    probe = await backend.probe()
    if not probe.usable:
        pytest.skip(f"cuda backend unusable: {probe.detail}")
    child = subprocess.Popen(  # noqa: ASYNC220 - a line-based child, read synchronously
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    # A process without CUDA in the job (a data loader, say) is left alone.
    plain = subprocess.Popen(["sleep", "120"])  # noqa: ASYNC220
    try:
        assert child.stdout is not None
        assert child.stdin is not None
        assert child.stdout.readline().strip() == "ready"
        job = JobHandle(job="child", group="g", pids=(child.pid, plain.pid))
        resident = await backend.device_bytes(job)
        assert resident >= 512 << 20
        out = await backend.snapshot(job, deadline=time.time() + 120)
        assert out.bytes == resident
        assert await backend.state(job) is BackendState.PARKED
        assert await backend.device_bytes(job) == 0
        back = await backend.restore(job, deadline=time.time() + 120)
        assert back.bytes == resident
        assert await backend.state(job) is BackendState.RUNNING
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "same"
    finally:
        for proc in (child, plain):
            proc.kill()
            proc.wait()


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["app", "cuda"])
def test_the_swap_bench_runs_on_a_gpu(backend: str) -> None:
    result = bench("--backend", backend, "--gib", "0.5", "--swaps", "2", "--steps", "3", "--json")
    assert result.returncode in (0, 1), result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["bit_identical"] == {"a": True, "b": True}
    assert report["snapshot_d2h"]["bytes"] >= 1 << 29
