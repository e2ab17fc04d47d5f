"""Real `rlslice` processes on loopback: the one process harness of the project.

The demo, the benches, the soak and the fault tests start schedulers, agents and
`rlslice up` the way a person would, as separate processes, and wait until they serve:

- `free_port()`: a free TCP port on 127.0.0.1;
- `child_env(extra)`: the environment of a child: no inherited `RLSLICE_*` setting, and
  PYTHONSAFEPATH=1 (so the repository root never shadows the standard library's
  `operator`), with `extra` on top;
- `rlslice_argv(*args)`: the command line of `python -m rlslice.apps ...` with its log level;
- `Service`: one server process, started, killed and restarted with the same argv (and so
  the same port); `start_service(argv, log)` starts one at once;
- `Service.wait_serving()` (async) and `wait_serving(address, service, ready)` (blocking):
  return once the address answers gRPC health SERVING, fail at once (with the log's tail)
  when the process dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a child, without its RLSLICE_* settings, with
    PYTHONSAFEPATH=1 and `extra` on top."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLSLICE_")}
    env["PYTHONSAFEPATH"] = "1"
    env.update(extra or {})
    return env


def rlslice_argv(*args: str, log_level: str | None = None) -> list[str]:
    """`python -m rlslice.apps --log-level LEVEL ARGS...`, with this interpreter. LEVEL
    defaults to `RLSLICE_TEST_LOG_LEVEL` (WARNING when unset): DEBUG there puts every
    component's reasoning into the logs a failing system test leaves in its tmp dir."""
    level = log_level or os.environ.get("RLSLICE_TEST_LOG_LEVEL", "WARNING")
    return [sys.executable, "-m", "rlslice.apps", "--log-level", level, *args]


@dataclass
class Service:
    """One server process: started, killed, restarted with the same argv and port.

    Its output goes to `log` (appended: a restart keeps what the last run wrote).
    """

    name: str
    argv: list[str]
    log: Path
    address: str = ""
    """Where it serves, for `wait_serving` ("" when the caller knows better)."""
    env: dict[str, str] = field(default_factory=child_env)
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        """Launch the process (a server binds its port in well under a second)."""
        assert not self.alive, f"{self.name} runs already"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as sink:
            self.process = subprocess.Popen(
                self.argv, stdout=sink, stderr=subprocess.STDOUT, env=self.env
            )
        self.starts += 1

    def check_alive(self) -> None:
        """Raise `RuntimeError` with the end of the log if the process has exited."""
        if not self.alive:
            tail = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
            code = None if self.process is None else self.process.returncode
            raise RuntimeError(f"{self.name} ({self.argv!r}) exited with {code}:\n{tail}")

    def kill(self, sig: int = signal.SIGKILL, timeout: float = 20.0) -> None:
        """Send `sig` (SIGKILL: no cleanup at all) and reap the process; SIGKILL after
        `timeout` seconds if it is still there."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(sig)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM, a graceful stop; SIGKILL only if it must."""
        self.kill(signal.SIGTERM, timeout)

    async def wait_serving(self, timeout: float = 30.0) -> None:
        """Return once the health check answers SERVING; fail if the process exits."""
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        loop = asyncio.get_running_loop()
        give_up = loop.time() + timeout
        async with grpc.aio.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                self.check_alive()
                with contextlib.suppress(grpc.aio.AioRpcError):
                    answer = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                    if answer.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                if loop.time() > give_up:
                    raise TimeoutError(f"{self.name} did not serve within {timeout:g} s")
                await asyncio.sleep(0.05)

    async def restart(self, timeout: float = 30.0) -> None:
        """Start again (after a kill) and wait until it serves."""
        self.start()
        await self.wait_serving(timeout)


def start_service(
    argv: list[str], log: Path, env: Mapping[str, str] | None = None, *, address: str = ""
) -> Service:
    """Start `argv` with stdout and stderr into `log` (emptied first) and the environment
    `child_env(env)`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_bytes(b"")
    service = Service(Path(argv[0]).name, argv, log, address, child_env(env))
    service.start()
    return service


def wait_serving(
    address: str,
    service: Service,
    ready: Callable[[], bool] = lambda: True,
    timeout: float = 30.0,
) -> None:
    """Return once `address` answers health SERVING and `ready()` is true (blocking, for
    code without an event loop).

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
