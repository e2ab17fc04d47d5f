"""The GPU worker of one node of `train.py`'s job: holds the job's device state on every
GPU Slurm bound to the task (`--gres`, seen as `CUDA_VISIBLE_DEVICES`) and runs GPU phases.

Driven over JSON lines on stdin/stdout by its driver: `{"op": "hello"}` (answered at once),
`{"op": "init"}`, `{"op": "rollout", "seconds": s}`, `{"op": "train", "seconds": s,
"reward": r}`, `{"op": "quit"}`. Before each phase it checks that its state is the one it
left (bit for bit), so a snapshot and restore that lost or changed a byte fails the job.
Where the `sim` backend's devices are (`RLSLICE_SIM_ROOT` set, as the sbatch script and a
site with sim agents set it) the state is emulated device memory (`rlslice.client.sim`);
otherwise torch tensors on every visible `cuda:N` (not run by the tests: no GPU there).
"""

from __future__ import annotations

import json
import os
import sys
import time
import zlib
from typing import Any

import numpy as np

from rlslice.client import sim

STRIDE = 4096  # float32 elements between touched values: every page is touched


class Worker:
    """One buffer of `state_bytes` per visible device, updated by GPU phases."""

    def __init__(self, state_bytes: int, seed: int) -> None:
        self.state_bytes = state_bytes
        self.seed = seed
        self.arrays: list[Any] = []
        self.checksums: list[int] = []
        self.devices: list[str] = []

    def init(self) -> dict[str, Any]:
        if not os.environ.get("RLSLICE_SIM_ROOT"):
            return self._init_cuda()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0")
        count = len([v for v in visible.split(",") if v.strip()]) or 1
        rng = np.random.default_rng(self.seed)
        for index in range(count):
            device = sim.attach(index)
            buffer = device.alloc(self.state_bytes, tag="weights")
            array = np.frombuffer(buffer, dtype=np.float32)
            array[:] = rng.standard_normal(array.size, dtype=np.float32)
            self.arrays.append(array)
            self.devices.append(device.name)
        self.checksums = [self._sum(a) for a in self.arrays]
        return {"ok": True, "devices": self.devices, "pid": os.getpid()}

    def _init_cuda(self) -> dict[str, Any]:
        import torch

        for index in range(torch.cuda.device_count()):
            generator = torch.Generator(device=f"cuda:{index}").manual_seed(self.seed)
            tensor = torch.randn(self.state_bytes // 4, generator=generator, device=f"cuda:{index}")
            self.arrays.append(tensor)
            self.devices.append(f"cuda:{index}")
        self.checksums = [self._sum(a) for a in self.arrays]
        return {"ok": True, "devices": self.devices, "pid": os.getpid()}

    @staticmethod
    def _sum(array: Any) -> int:
        if not isinstance(array, np.ndarray):
            array = array.cpu().numpy()  # a torch tensor
        return zlib.crc32(array.tobytes())

    def _intact(self) -> None:
        now = [self._sum(a) for a in self.arrays]
        if now != self.checksums:
            raise RuntimeError(f"device state changed while parked: {self.checksums} -> {now}")

    def rollout(self, seconds: float) -> dict[str, Any]:
        self._intact()
        _busy(seconds)
        return {"ok": True}

    def train(self, seconds: float, reward: float) -> dict[str, Any]:
        self._intact()
        for array in self.arrays:
            view = array[::STRIDE]
            if isinstance(array, np.ndarray):
                view *= np.float32(0.999)
                view += np.float32(reward * 1e-3)
            else:
                view.mul_(0.999).add_(reward * 1e-3)
        self.checksums = [self._sum(a) for a in self.arrays]
        _busy(seconds)
        return {"ok": True}


def _busy(seconds: float) -> None:
    """Stand-in for GPU kernels: the phase takes `seconds`."""
    end = time.perf_counter() + seconds
    while (left := end - time.perf_counter()) > 0:
        time.sleep(min(left, 0.05))


def main() -> int:
    worker = Worker(state_bytes=int(sys.argv[1]), seed=int(sys.argv[2]))
    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        try:
            if op == "hello":
                answer = {"ok": True, "pid": os.getpid()}
            elif op == "init":
                answer = worker.init()
            elif op == "rollout":
                answer = worker.rollout(float(command["seconds"]))
            elif op == "train":
                answer = worker.train(float(command["seconds"]), float(command["reward"]))
            elif op == "quit":
                answer = {"ok": True}
            else:
                answer = {"ok": False, "error": f"op: unknown {op!r}"}
        except Exception as error:  # the driver reports it and fails the job
            answer = {"ok": False, "error": f"{type(error).__name__}: {error}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
        if op == "quit":
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
