"""A job process for the agent tests (run as a script, never imported).

    jobproc.py SOCKET NODE_DIR JOB GROUP SIZE [--no-register] [--spawn-child] [--seed N]

Registers with the agent over SOCKET (unless --no-register), allocates SIZE bytes of
emulated device memory, fills them with seeded random bytes, and prints one JSON line:
{"pid", "registered_pid", "hash", "child"}. Then it answers commands on stdin, one JSON
line each: `hash` (sha256 of its memory), `alloc N` (another buffer), `quit`.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys

from rlslice.client import register_with_agent, sim


def main() -> int:
    socket_path, node_dir, job, group, size = sys.argv[1:6]
    flags = sys.argv[6:]
    seed = int(flags[flags.index("--seed") + 1]) if "--seed" in flags else 7
    registered = 0
    if "--no-register" not in flags:
        registered = register_with_agent(socket_path, job, group).pid
    child = 0
    if "--spawn-child" in flags:
        helper = subprocess.Popen(
            [sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"],
            stdin=subprocess.DEVNULL,
        )
        child = helper.pid
    device = sim.attach(job=job, node_dir=node_dir)
    buffers = []
    if int(size):
        buffer = device.alloc(int(size), tag="weights")
        buffer[:] = random.Random(seed).randbytes(int(size))
        buffers.append(buffer)

    def digest() -> str:
        h = hashlib.sha256()
        for b in buffers:
            h.update(b)
        return h.hexdigest()

    print(
        json.dumps(
            {"pid": os.getpid(), "registered_pid": registered, "hash": digest(), "child": child}
        ),
        flush=True,
    )
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "hash":
            print(json.dumps({"hash": digest()}), flush=True)
        elif words[0] == "alloc":
            try:
                buffers.append(device.alloc(int(words[1]), tag="more"))
            except sim.SimOutOfMemoryError as error:
                print(json.dumps({"error": str(error), "type": type(error).__name__}), flush=True)
            else:
                print(json.dumps({"ok": True}), flush=True)
        elif words[0] == "quit":
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
