"""Real scheduler and agent processes on loopback, to be killed and restarted at will.

Used by `rlslice bench soak` and by the fault-injection tests. Each service is an
`rlslice scheduler` or `rlslice agent` subprocess (`Service`) on a fixed port chosen once,
so a restart comes back at the same address (clients and the scheduler reconnect by
themselves). Readiness is the standard gRPC health check answering SERVING.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlslice.testing._processes import Service, free_port, rlslice_argv

MiB = 1 << 20


@dataclass
class AgentNode:
    """An agent process and where its jobs find it."""

    service: Service
    node: str
    socket_path: Path
    node_dir: Path
    """The node's sim folder (`<sim root>/<node>`)."""


def _scheduler_service(
    work: Path, store: Path, scheduler_args: Sequence[str], command: Sequence[str] | None
) -> Service:
    """`rlslice scheduler` (or `command`, an argv that takes the same flags) on a free
    loopback port over the SQLite `store`."""
    port = free_port()
    return Service(
        "scheduler",
        [
            *(rlslice_argv("scheduler") if command is None else command),
            "--address",
            f"127.0.0.1:{port}",
            "--store",
            str(store),
            "--auto-create-groups",
            "--shutdown-grace",
            "1",
            *scheduler_args,
        ],
        work / "scheduler.log",
        f"127.0.0.1:{port}",
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
        scheduler_command: Sequence[str] | None = None,
    ) -> None:
        """`scheduler_command`: the argv that runs the scheduler, before its flags
        (default `rlslice scheduler`); the fault tests pass one with short deadlines to
        agents (`rlslice.apps.bench.soak.scheduler.argv`)."""
        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        self.store = work / "scheduler.sqlite"
        self._sockets = Path(tempfile.mkdtemp(prefix="rls-", dir="/tmp"))
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.sim_root = Path(tempfile.mkdtemp(prefix="rlslice-soak-", dir=shm))
        self.scheduler = _scheduler_service(work, self.store, scheduler_args, scheduler_command)
        self.agents: dict[str, AgentNode] = {}
        for node in nodes:
            agent_port = free_port()
            socket_path = self._sockets / f"{node}.sock"
            argv = rlslice_argv(
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
                f"agent {node}", argv, work / f"{node}.log", f"127.0.0.1:{agent_port}"
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
