"""An RL-shaped job on the `sim` backend, run inside a job container by tests/deploy/image.

Shaped the way docs/agent.md asks `sim` jobs to be: a driver that holds the `Client` and
runs the CPU phases, and a GPU worker that holds the emulated device memory and is the only
process registered with the agent (the agent stops a parked job's registered processes; a
registered driver stopped between its yield and its next acquire could never ask again).

Each step: a rollout phase (the worker reads the policy's weights and returns a sample),
reward scoring on the CPU outside any phase in the driver (another job takes the GPU
meanwhile and the worker is parked), a train phase (the worker updates the weights in
place). Every switch parks and restores the weights; the driver checks after every grant
that the bytes the worker left are the bytes it finds, and prints one JSON line at the end.

    rlslice run --no-register --job J --group G --agent-socket S --scheduler A \\
        -- python rl_job.py STEPS BYTES BARRIER_DIR JOBS

The driver starts its worker through `rlslice run` (which registers the worker alone). The
jobs start their loops together: each leaves a file in BARRIER_DIR (a volume they share) and
waits until JOBS files are there, so they contend from the first step.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from rlslice.apps.shared.worker_pipe import WorkerPipe

STRIDE = 4096  # bytes between the values a rollout samples: every page is read
SCORING_SECONDS = 0.05


def barrier(folder: Path, parties: int, timeout: float = 60) -> None:
    """Wait until `parties` jobs have each left a file in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / os.environ["RLSLICE_JOB"]).touch()
    deadline = time.monotonic() + timeout
    while len(list(folder.iterdir())) < parties:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(list(folder.iterdir()))} of {parties} jobs came")
        time.sleep(0.02)


def worker(size: int) -> int:
    """The GPU worker: JSON commands on stdin, one JSON answer per line on stdout
    (`rlslice.apps.shared.worker_pipe`'s protocol: every answer says `ok`)."""
    from rlslice.client import sim

    weights = sim.attach().alloc(size, tag="weights")
    view = memoryview(weights)
    view[:] = bytes([7]) * size
    for line in sys.stdin:
        command = json.loads(line)
        answer: dict[str, Any] = {}
        if command["op"] == "quit":
            break
        if command["op"] == "rollout":
            answer["sample"] = list(view[::STRIDE])
        elif command["op"] == "train":
            view[command["index"] % size] = command["value"]
        answer["digest"] = hashlib.sha256(view).hexdigest()
        print(json.dumps({"ok": True, **answer}), flush=True)
    return 0


def start_worker(size: int, agent_socket: str) -> WorkerPipe:
    """The worker, started through `rlslice run`, which registers it (and it alone)."""
    argv = [
        *("rlslice", "run", "--job", os.environ["RLSLICE_JOB"]),
        *("--group", os.environ["RLSLICE_GROUP"], "--agent-socket", agent_socket),
        *("--", sys.executable, os.path.abspath(__file__), "worker", str(size)),
    ]
    return WorkerPipe(argv, env=dict(os.environ))


def driver(steps: int, size: int, folder: Path, parties: int) -> int:
    # A client that sees the agent's socket registers its own process: the driver must
    # not be registered (docs/agent.md), only the worker it starts.
    agent_socket = os.environ.pop("RLSLICE_AGENT_SOCKET")
    from rlslice import Client

    gpu = start_worker(size, agent_socket)
    expected = gpu.call(op="digest")["digest"]
    restored = moved = 0
    barrier(folder, parties)
    with Client() as client:  # job, group, scheduler, token: from the environment
        for step in range(steps):
            with client.phase("rollout") as grant:
                restored += bool(grant.restored)
                moved += grant.moved_bytes
                rollout = gpu.call(op="rollout")
                assert rollout["digest"] == expected, "weights changed"
            # CPU: scoring, long enough that the other job's grant parks this job's worker
            # meanwhile (a registered driver would be stopped here for good).
            time.sleep(SCORING_SECONDS)
            reward = sum(rollout["sample"]) % 251
            with client.phase("train") as grant:
                restored += bool(grant.restored)
                moved += grant.moved_bytes
                found = gpu.call(op="digest")["digest"]
                assert found == expected, "weights changed"
                expected = gpu.call(op="train", index=step, value=(reward + step) % 256)["digest"]
    gpu.close()
    status = gpu.process.returncode
    assert status == 0, f"the worker exited {status}"
    summary = {"steps": steps, "restored": restored, "moved_bytes": moved, "digest": expected}
    print(json.dumps(summary), flush=True)
    return 0


def main() -> int:
    if sys.argv[1] == "worker":
        return worker(int(sys.argv[2]))
    return driver(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]))


if __name__ == "__main__":
    sys.exit(main())
