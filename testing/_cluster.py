"""Real scheduler and agent processes on loopback, to be killed and restarted at will.

Used by `rlslice bench soak` and by the fault-injection tests. Each service is an
`rlslice scheduler` or `rlslice agent` subprocess on a fixed port chosen once, so a
restart comes back at the same address (clients and the scheduler reconnect by
themselves). Readiness is the standard gRPC health check answering SERVING.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MiB = 1 << 20


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a child: no inherited RLSLICE_* settings, never the cwd on sys.path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLSLICE_")}
    env["PYTHONSAFEPATH"] = "1"
    env.update(extra or {})
    return env


def cli(*args: str) -> list[str]:
    """argv of `rlslice ARGS...` with this interpreter."""
    return [sys.executable, "-m", "rlslice.apps", "--log-level", "WARNING", *args]


@dataclass
class Service:
    """One server process: started, killed, restarted with the same argv and port."""

    name: str
    argv: list[str]
    address: str
    log: Path
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
        """Launch the process (it binds its port in well under a second)."""
        assert not self.alive, f"{self.name} runs already"
        with self.log.open("ab") as sink:
            self.process = subprocess.Popen(
                self.argv, stdout=sink, stderr=subprocess.STDOUT, env=self.env
            )
        self.starts += 1

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send `sig` (SIGKILL: no cleanup at all) and reap the process."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(sig)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        """SIGTERM: a graceful stop."""
        self.kill(signal.SIGTERM)

    async def wait_serving(self, timeout: float = 30.0) -> None:
        """Return once the health check answers SERVING; fail if the process exits."""
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        loop = asyncio.get_running_loop()
        give_up = loop.time() + timeout
        async with grpc.aio.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                if not self.alive:
                    tail = self.log.read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"{self.name} exited:\n{tail}")
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


@dataclass
class AgentNode:
    """An agent process and where its jobs find it."""

    service: Service
    node: str
    socket_path: Path
    node_dir: Path
    """The node's sim folder (`<sim root>/<node>`)."""


def _scheduler_service(
    work: Path, store: Path, scheduler_args: Sequence[str], agent_rpc_timeout: float | None
) -> Service:
    """`rlslice scheduler` on a free loopback port over the SQLite `store`; with
    `agent_rpc_timeout`, the soak's own entry point that shortens its deadlines to agents."""
    port = free_port()
    command = cli("scheduler")
    if agent_rpc_timeout is not None:
        command = [
            sys.executable,
            "-m",
            "rlslice.apps.bench.soak.scheduler",
            "--agent-rpc-timeout",
            repr(agent_rpc_timeout),
            "--agent-status-timeout",
            repr(min(5.0, agent_rpc_timeout)),
        ]
    return Service(
        "scheduler",
        [
            *command,
            "--address",
            f"127.0.0.1:{port}",
            "--store",
            str(store),
            "--auto-create-groups",
            "--shutdown-grace",
            "1",
            *scheduler_args,
        ],
        f"127.0.0.1:{port}",
        work / "scheduler.log",
    )


class Cluster:
    """A scheduler process and agent processes, all on loopback, sharing one sim root.

    `work` keeps logs, the SQLite store and the agents' state; sockets and emulated device
    memory live in short folders of their own (`/tmp`, `/dev/shm`), removed by `close()`.
    """

    def __init__(
        self,
        work: Path,
        *,
        nodes: Sequence[str] = ("n1",),
        capacity_bytes: int = 64 * MiB,
        rate_gbps: float = 0.0,
        host_reserve_bytes: int = 0,
        scheduler_args: Sequence[str] = (),
        agent_args: Sequence[str] = (),
        agent_rpc_timeout: float | None = None,
    ) -> None:
        """`agent_rpc_timeout`: the scheduler's deadline for each Snapshot/Restore (and
        Status) call to an agent, for tests that cut an agent off (default: production's)."""
        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        self.store = work / "scheduler.sqlite"
        self._sockets = Path(tempfile.mkdtemp(prefix="rls-", dir="/tmp"))
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.sim_root = Path(tempfile.mkdtemp(prefix="rlslice-soak-", dir=shm))
        self.scheduler = _scheduler_service(work, self.store, scheduler_args, agent_rpc_timeout)
        self.agents: dict[str, AgentNode] = {}
        for node in nodes:
            agent_port = free_port()
            socket_path = self._sockets / f"{node}.sock"
            argv = cli(
                "agent",
                "--node", node,
                "--address", f"127.0.0.1:{agent_port}",
                "--socket", str(socket_path),
                "--state-dir", str(work / f"agent-{node}"),
                "--sim-root", str(self.sim_root),
                "--sim-capacity", str(capacity_bytes),
                "--sim-rate-gbps", repr(rate_gbps),
                "--host-reserve", str(host_reserve_bytes),
                "--scheduler", self.scheduler.address,
                *agent_args,
            )  # fmt: skip
            service = Service(
                f"agent {node}", argv, f"127.0.0.1:{agent_port}", work / f"{node}.log"
            )
            self.agents[node] = AgentNode(service, node, socket_path, self.sim_root / node)

    @property
    def address(self) -> str:
        """The scheduler's address."""
        return self.scheduler.address

    async def start(self) -> None:
        """Start the scheduler, then every agent; return once all serve."""
        self.scheduler.start()
        await self.scheduler.wait_serving()
        for agent in self.agents.values():
            agent.service.start()
        await asyncio.gather(*(a.service.wait_serving() for a in self.agents.values()))

    async def wait_agents_known(self, group: str, timeout: float = 20.0) -> None:
        """Return once the scheduler lists every agent among `group`'s nodes (a group with
        no `nodes` of its own takes every registered agent)."""
        import grpc

        from rlslice.v1alpha1 import scheduler_pb2 as pb
        from rlslice.v1alpha1 import scheduler_pb2_grpc

        loop = asyncio.get_running_loop()
        give_up = loop.time() + timeout
        want = set(self.agents)
        async with grpc.aio.insecure_channel(self.address) as channel:
            stub: Any = scheduler_pb2_grpc.SchedulerStub(channel)
            while True:
                with contextlib.suppress(grpc.aio.AioRpcError):
                    status = await stub.GetGroup(pb.GetGroupRequest(group=group), timeout=2)
                    if want <= set(status.nodes):
                        return
                if loop.time() > give_up:
                    raise TimeoutError(f"agents {sorted(want)} not all known to the scheduler")
                await asyncio.sleep(0.05)

    def close(self) -> None:
        """Stop every process (gracefully, then by force) and remove the temporary folders."""
        for agent in self.agents.values():
            agent.service.stop()
        self.scheduler.stop()
        shutil.rmtree(self._sockets, ignore_errors=True)
        shutil.rmtree(self.sim_root, ignore_errors=True)

    def sim_bytes(self) -> dict[str, int]:
        """Bytes under each node's sim folder: `jobs` (device memory) and `parked` (host)."""
        totals = {"jobs": 0, "parked": 0}
        for agent in self.agents.values():
            for part in totals:
                totals[part] += _tree_bytes(agent.node_dir / part)
        return totals

    def sim_owners(self) -> list[str]:
        """`node/part/job` of every sim folder that still holds bytes (for leak reports)."""
        found = []
        for agent in self.agents.values():
            for part in ("jobs", "parked"):
                folder = agent.node_dir / part
                jobs: list[Path] = []
                with contextlib.suppress(OSError):  # the agent may remove it as we look
                    jobs = sorted(folder.iterdir())
                for job in jobs:
                    size = _tree_bytes(job)
                    if size:
                        found.append(f"{agent.node}/{part}/{job.name}: {size} bytes")
        return found


def _tree_bytes(folder: Path) -> int:
    """Bytes of the files under `folder`, read while the agent may be removing them.

    `Path.rglob` raises when a directory vanishes between listing and descending into it
    (a job's folder freed mid-walk); `os.walk` skips what vanished, and a file gone before
    its `stat` counts as 0 bytes, which is what it now holds.
    """
    total = 0
    for parent, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(parent, name)).st_size
    return total
