"""A worker process driven over JSON lines on its stdin/stdout (the demo's and the soak's
GPU workers): one request, one answer, `ok` or an error."""

from __future__ import annotations

import json
import subprocess
from typing import IO, Any


class WorkerPipe:
    """JSON lines to and from a worker process."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True
        )
        assert self.process.stdin
        assert self.process.stdout
        self._in: IO[str] = self.process.stdin
        self._out: IO[str] = self.process.stdout

    def call(self, **command: Any) -> dict[str, Any]:
        self._in.write(json.dumps(command) + "\n")
        self._in.flush()
        line = self._out.readline()
        if not line:
            raise RuntimeError(f"worker exited with {self.process.wait()}")
        answer: dict[str, Any] = json.loads(line)
        if not answer.get("ok"):
            raise RuntimeError(answer.get("error", "worker failed"))
        return answer

    def close(self) -> None:
        try:
            self.call(op="quit")
        except (RuntimeError, OSError, ValueError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
