"""The GPU worker of a demo job: holds the job's emulated device state and runs its GPU phases.

Like the rollout engine or training worker of an RL framework, it is a separate process
driven by its job's driver over a pipe (JSON lines on stdin/stdout). Only the worker
registers with the node's agent, so only it is frozen while the job is parked; the driver
keeps scoring rewards on the CPU and asks for the GPU again when it needs it.

Commands: `{"op": "init"}`, `{"op": "rollout", "seconds": s}`,
`{"op": "train", "seconds": s, "reward": r}`, `{"op": "digest"}`, `{"op": "quit"}`.
Every answer is one JSON line with `ok` and the state's running checksum.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import zlib
from typing import Any

import numpy as np

STRIDE = 4096  # float32 elements between touched values: a phase touches every page


class DemoWorker:
    """Deterministic 'model' state in emulated device memory, updated by GPU phases."""

    def __init__(self, job: str, group: str, state_bytes: int, seed: int, device: int) -> None:
        self.job = job
        self.group = group
        self.state_bytes = state_bytes
        self.seed = seed
        self.device_index = device
        self.weights: np.ndarray[Any, np.dtype[np.float32]] | None = None
        self._buffer: Any = None

    def init(self) -> dict[str, Any]:
        from rlslice import env

        socket_path = os.environ.get(env.AGENT_SOCKET)
        if socket_path:
            from rlslice.client import register_with_agent

            register_with_agent(socket_path, self.job, self.group)
        from rlslice.client import sim

        device = sim.attach(self.device_index, job=self.job)
        self._buffer = device.alloc(self.state_bytes, tag="weights")
        weights = np.frombuffer(self._buffer, dtype=np.float32)
        rng = np.random.default_rng(self.seed)
        weights[:] = rng.standard_normal(weights.size, dtype=np.float32)
        self.weights = weights
        return {"ok": True, "checksum": self.checksum()}

    def checksum(self) -> int:
        assert self.weights is not None
        return zlib.crc32(self.weights[::STRIDE].tobytes())

    def rollout(self, seconds: float) -> dict[str, Any]:
        assert self.weights is not None
        deadline = time.perf_counter() + seconds
        sample = float(np.abs(self.weights[::STRIDE]).mean())
        _sleep_until(deadline)
        return {"ok": True, "sample": sample, "checksum": self.checksum()}

    def train(self, seconds: float, reward: float) -> dict[str, Any]:
        assert self.weights is not None
        deadline = time.perf_counter() + seconds
        view = self.weights[::STRIDE]
        view *= np.float32(0.999)
        view += np.float32(reward * 1e-3)
        _sleep_until(deadline)
        return {"ok": True, "checksum": self.checksum()}

    def digest(self) -> dict[str, Any]:
        assert self.weights is not None
        return {"ok": True, "sha256": hashlib.sha256(self.weights.tobytes()).hexdigest()}


def _sleep_until(deadline: float) -> None:
    left = deadline - time.perf_counter()
    if left > 0:
        time.sleep(left)


def main() -> int:
    job, group, state_bytes, seed, device = (
        sys.argv[1],
        sys.argv[2],
        int(sys.argv[3]),
        int(sys.argv[4]),
        int(sys.argv[5]),
    )
    worker = DemoWorker(job, group, state_bytes, seed, device)
    out = sys.stdout
    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        try:
            if op == "init":
                answer = worker.init()
            elif op == "rollout":
                answer = worker.rollout(float(command["seconds"]))
            elif op == "train":
                answer = worker.train(float(command["seconds"]), float(command["reward"]))
            elif op == "digest":
                answer = worker.digest()
            elif op == "quit":
                out.write(json.dumps({"ok": True}) + "\n")
                out.flush()
                return 0
            else:
                answer = {"ok": False, "error": f"op: unknown {op!r}"}
        except Exception as error:  # the driver reports it; the worker stays up
            answer = {"ok": False, "error": f"{type(error).__name__}: {error}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
