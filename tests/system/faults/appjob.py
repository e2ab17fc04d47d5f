"""An `app`-backend job process for the fault tests, on CPU (run as a script, never imported).

    appjob.py SOCKET JOB GROUP

Runs `rlslice.client.offload.serve_offload` (in its thread) with an offloader whose
"device memory" is a bytearray: OFFLOAD copies it to a host buffer and frees it, RESTORE
copies it back. The test can hold either move in the middle (`gate`), so it can break the
workload stream while the agent waits for the answer. Commands on stdin, one JSON line
each, answered with one JSON line on stdout:

    {"op": "init", "size": N, "seed": S}  fill N bytes of device memory with seeded bytes
    {"op": "hash"}                        sha256 of the job's bytes, wherever they are,
                                          and whether they are on the device
    {"op": "gate", "closed": true|false}  hold every later OFFLOAD/RESTORE until opened
    {"op": "quit"}

Events come on stdout too, as {"event": ...} lines: "connected" (the stream to the agent is
open, each time), "offloading" / "restoring" (a move started), "offloaded" / "restored",
"ended" (the offload loop stopped for good, with its "error").
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

_lock = threading.Lock()


def _say(message: dict[str, Any]) -> None:
    with _lock:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


class BytesOffloader:
    """Device memory that is a bytearray; a gate the test opens and closes."""

    modes = frozenset({"offload"})
    tags = ("weights",)

    def __init__(self) -> None:
        self.device: bytearray | None = bytearray()
        self.host: bytes | None = None
        self.gate = threading.Event()
        self.gate.set()

    def offload(self, discard_tags: Sequence[str] = ()) -> Any:
        from rlslice.client.offload import OffloadResult

        start = time.monotonic()
        _say({"event": "offloading"})
        self.gate.wait()
        assert self.device is not None, "offload of a job already offloaded"
        self.host, self.device = bytes(self.device), None
        _say({"event": "offloaded"})
        return OffloadResult(len(self.host), time.monotonic() - start)

    def restore(self) -> Any:
        from rlslice.client.offload import OffloadResult

        start = time.monotonic()
        if self.host is None:
            return OffloadResult(0, 0.0)  # nothing offloaded: a no-op
        _say({"event": "restoring"})
        self.gate.wait()
        self.device, self.host = bytearray(self.host), None
        _say({"event": "restored"})
        return OffloadResult(len(self.device), time.monotonic() - start)

    def digest(self) -> dict[str, Any]:
        data = self.device if self.device is not None else self.host
        assert data is not None
        return {"hash": hashlib.sha256(data).hexdigest(), "on_device": self.device is not None}


def main(socket_path: str, job: str, group: str) -> int:
    from rlslice.client.offload import serve_offload

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    offloader = BytesOffloader()
    _say({"pid": os.getpid()})
    loop_thread = threading.Thread(
        target=_serve, args=(serve_offload, offloader, socket_path, job, group), daemon=True
    )
    loop_thread.start()
    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        if op == "init":
            size = int(command["size"])
            offloader.device = bytearray(random.Random(int(command["seed"])).randbytes(size))
            _say({"ok": True, **offloader.digest()})
        elif op == "hash":
            _say({"ok": True, **offloader.digest()})
        elif op == "gate":
            if command["closed"]:
                offloader.gate.clear()
            else:
                offloader.gate.set()
            _say({"ok": True})
        elif op == "quit":
            _say({"ok": True})
            return 0
    return 0


def _serve(serve: Any, offloader: BytesOffloader, socket_path: str, job: str, group: str) -> None:
    import asyncio

    def connected() -> None:
        _say({"event": "connected"})

    try:
        asyncio.run(
            serve(offloader, job=job, group=group, socket_path=socket_path, on_connected=connected)
        )
    except BaseException as error:  # the loop gave up: the test says why at once
        _say({"event": "ended", "error": f"{type(error).__name__}: {error}"})
        raise


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
