"""A job's processes for the fault tests (run as a script, never imported).

    worker.py worker SOCKET NODE_DIR JOB GROUP
        The GPU worker: registers itself with the node's agent over SOCKET (the agent reads
        its pid from the socket), then answers JSON commands on stdin, one JSON line each:
        {"op": "init", "size": N, "seed": S}  allocate N bytes of emulated device memory
                                              and fill them with seeded bytes
        {"op": "step", "k": K}                change one byte per page, deterministically
        {"op": "hash"}                        sha256 of the device memory
        {"op": "quit"}
    worker.py driver SCHEDULER JOB GROUP LEASE_SECONDS DEVICE_BYTES
        The job's driver (never frozen): holds an `rlslice.Client` and answers
        {"op": "acquire", "timeout": T}, {"op": "yield"}, {"op": "quit"}, and
        {"op": "enter"} / {"op": "exit"}: enter and leave a `client.phase("train")` block
        (an error, LockLostError say, comes back as {"ok": false, "error": NAME}).

The first line of either is {"pid": ...}. Like the demo's jobs, only the worker registers
with the agent, so only the worker is frozen while the job is parked.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
from typing import Any

PAGE = 4096


def _say(answer: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()


def worker(socket_path: str, node_dir: str, job: str, group: str) -> int:
    from rlslice.client import register_with_agent, sim

    registered = register_with_agent(socket_path, job, group).pid
    _say({"pid": os.getpid(), "registered_pid": registered})
    buffer: Any = None
    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        if op == "init":
            device = sim.attach(job=job, node_dir=node_dir)
            size = int(command["size"])
            try:
                buffer = device.alloc(size, tag="weights")
            except sim.SimOutOfMemoryError as error:
                _say({"ok": False, "error": str(error)})
                continue
            buffer[:] = random.Random(int(command["seed"])).randbytes(size)
            _say({"ok": True, "hash": hashlib.sha256(buffer).hexdigest()})
        elif op == "step":
            k = int(command["k"])
            offset = (k * 131) % PAGE
            for start in range(offset, len(buffer), PAGE):
                buffer[start] = (buffer[start] + k) % 256
            _say({"ok": True, "hash": hashlib.sha256(buffer).hexdigest()})
        elif op == "hash":
            _say({"ok": True, "hash": hashlib.sha256(buffer).hexdigest()})
        elif op == "quit":
            _say({"ok": True})
            return 0
    return 0


def driver(scheduler: str, job: str, group: str, lease: str, device_bytes: str) -> int:
    from rlslice import Client, RlsliceError

    client = Client(
        job=job,
        group=group,
        scheduler=scheduler,
        lease_seconds=float(lease),
        device_bytes=int(device_bytes),
    )
    _say({"pid": os.getpid()})
    phase = client.phase("train")
    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        try:
            if op == "enter":
                grant = phase.__enter__()
                _say({"ok": True, "epoch": grant.epoch, "restored": grant.restored})
            elif op == "exit":
                phase.__exit__(None, None, None)
                _say({"ok": True})
            elif op == "acquire":
                grant = client.acquire(timeout=float(command.get("timeout", 30)))
                _say({"ok": True, "epoch": grant.epoch, "restored": grant.restored})
            elif op == "yield":
                answer = client.yield_()
                _say({"ok": True, "waiters": answer.waiters})
            elif op == "quit":
                client.close()
                _say({"ok": True})
                return 0
        except RlsliceError as error:
            epoch = getattr(error, "epoch", None)
            _say(
                {"ok": False, "error": type(error).__name__, "message": str(error), "epoch": epoch}
            )
    return 0


if __name__ == "__main__":
    role, *rest = sys.argv[1:]
    sys.exit(worker(*rest) if role == "worker" else driver(*rest))
