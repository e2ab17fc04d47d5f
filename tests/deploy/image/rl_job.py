"""An RL-shaped job on the `sim` backend, run inside a job container by tests/deploy/image.

Each step: a rollout phase on the emulated GPU (the policy's weights are read), reward
scoring on the CPU outside any phase (another job takes the GPU meanwhile), a train phase
(the weights are updated in place). The weights live in one emulated device buffer, so
every switch parks and restores them; the job checks after every grant that the bytes it
left are the bytes it finds, and prints one JSON line at the end.

    rlslice run --job J --group G -- python rl_job.py STEPS BYTES BARRIER_DIR JOBS

The jobs start their loops together: each leaves a file in BARRIER_DIR (a volume they
share) and waits until JOBS files are there, so they contend from the first step.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

from rlslice import Client
from rlslice.client import sim


def barrier(folder: Path, parties: int, timeout: float = 60) -> None:
    """Wait until `parties` jobs have each left a file in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / os.environ["RLSLICE_JOB"]).touch()
    deadline = time.monotonic() + timeout
    while len(list(folder.iterdir())) < parties:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(list(folder.iterdir()))} of {parties} jobs came")
        time.sleep(0.02)


def main() -> int:
    steps, size = int(sys.argv[1]), int(sys.argv[2])
    folder, parties = Path(sys.argv[3]), int(sys.argv[4])
    device = sim.attach()
    weights = device.alloc(size, tag="weights")
    view = memoryview(weights)
    view[:] = bytes([7]) * size
    expected = hashlib.sha256(view).hexdigest()
    restored = moved = 0
    barrier(folder, parties)
    with Client() as client:  # job, group, scheduler, token: from the environment
        for step in range(steps):
            with client.phase("rollout") as grant:
                restored += bool(grant.restored)
                moved += grant.moved_bytes
                assert hashlib.sha256(view).hexdigest() == expected, "weights changed"
            reward = sum(view[i] for i in range(0, size, 4096)) % 251  # CPU: scoring
            with client.phase("train") as grant:
                restored += bool(grant.restored)
                moved += grant.moved_bytes
                assert hashlib.sha256(view).hexdigest() == expected, "weights changed"
                view[step % size] = (reward + step) % 256
                expected = hashlib.sha256(view).hexdigest()
    summary = {"steps": steps, "restored": restored, "moved_bytes": moved, "digest": expected}
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
