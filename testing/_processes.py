"""The one process harness of the applications: run `rlslice` services as real processes.

The demo, the benches and the soak start schedulers, agents and `rlslice up` the way a
person would, as separate processes, and wait until they serve. This module is how:

- `rlslice_argv(*args)`: the command line of `python -m rlslice.apps ...` with its log level;
- `child_env(extra)`: the environment of a child (PYTHONSAFEPATH=1, so the repository root
  never shadows the standard library's `operator`), plus `extra`;
- `start_service(argv, log)`: a `Service` whose output goes to `log`; `stop()` sends
  SIGTERM, waits, and kills only if it must;
- `wait_serving(address, service, ready)`: returns once the address answers gRPC health
  SERVING and `ready()` holds, fails at once (with the log's tail) when the process dies;
- `free_port()`: a free TCP port on 127.0.0.1.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a child, with PYTHONSAFEPATH=1 and `extra` on top."""
    env = dict(os.environ)
    env["PYTHONSAFEPATH"] = "1"
    env.update(extra or {})
    return env


def rlslice_argv(*args: str, log_level: str = "WARNING") -> list[str]:
    """`python -m rlslice.apps --log-level LEVEL ARGS...`, with this interpreter."""
    return [sys.executable, "-m", "rlslice.apps", "--log-level", log_level, *args]


@dataclass
class Service:
    """A service process started by `start_service`."""

    process: subprocess.Popen[bytes]
    log: Path

    def check_alive(self) -> None:
        """Raise `RuntimeError` with the end of the log if the process has exited."""
        if self.process.poll() is not None:
            tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(
                f"{self.process.args!r} exited with {self.process.returncode}:\n{tail}"
            )

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, then wait up to `timeout` seconds; SIGKILL only if it is still there."""
        if self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_service(argv: list[str], log: Path, env: Mapping[str, str] | None = None) -> Service:
    """Start `argv` with stdout and stderr into `log` and the environment `child_env(env)`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as sink:
        process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env=child_env(env))
    return Service(process, log)


def wait_serving(
    address: str,
    service: Service,
    ready: Callable[[], bool] = lambda: True,
    timeout: float = 30.0,
) -> None:
    """Return once `address` answers health SERVING and `ready()` is true.

    Raises `RuntimeError` as soon as the service exits, `TimeoutError` after `timeout`.
    """
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            service.check_alive()
            try:
                answer = stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                if answer.status == health_pb2.HealthCheckResponse.SERVING and ready():
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    raise TimeoutError(f"{address} did not serve within {timeout:g} s")
