"""`rlslice bench spill --oversubscribe`: 4 jobs over 3x the host budget take turns.

An agent in this process (`sim` backend, unlimited copy rate, a device holding every job)
with `host_budget_bytes` = one job's size, so the three parked jobs' state is 3x the
budget (all four jobs' 4x), and a spill directory under `base`; four real
job processes (`_switch_duplex.spawn_job`, crc32 of their bytes on request). Three park,
then the holder hands over round robin, one Switch per turn, until every job had `turns`.
A thread samples the parked bytes in host memory (the parts of the sim folder's parked
copies, read off the filesystem, not from the agent; their few-hundred-byte manifests
aside) and this process's RSS.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

JOBS = ("job-a", "job-b", "job-c", "job-d")


def _parked_bytes(node_dir: Path) -> int:
    total = 0
    for path in (node_dir / "parked").rglob("*"):
        try:
            if path.is_file() and path.name.endswith((".bin", ".fill")):
                total += path.stat().st_size
        except FileNotFoundError:
            continue
    return total


class _Sampler:
    """Peaks of parked host bytes and RSS, sampled every few milliseconds in a thread."""

    def __init__(self, node_dir: Path) -> None:
        self.node_dir = node_dir
        self.process = psutil.Process()
        self.rss_start = self.process.memory_info().rss
        self.parked_peak = self.rss_peak = self.sum_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            parked = _parked_bytes(self.node_dir)
            growth = max(0, self.process.memory_info().rss - self.rss_start)
            self.parked_peak = max(self.parked_peak, parked)
            self.rss_peak = max(self.rss_peak, growth)
            self.sum_peak = max(self.sum_peak, parked + growth)

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


async def oversubscribe(base: Path, *, job_size: int, turns: int, slack: int) -> dict[str, Any]:
    """Run the turns; the figures and whether the targets held."""
    from rlslice.adapters.channel import open_channel
    from rlslice.apps.bench._switch_duplex import spawn_job, stop_jobs
    from rlslice.snapshot_agent import AgentSettings, SimSettings, start_agent
    from rlslice.v1alpha1 import agent_pb2 as apb
    from rlslice.v1alpha1 import agent_pb2_grpc

    budget = job_size  # the parked jobs' state: 3x the budget
    root = Path(tempfile.mkdtemp(prefix="rlslice-over-", dir="/dev/shm"))
    work = Path(tempfile.mkdtemp(prefix="rso-", dir="/tmp"))
    settings = AgentSettings(
        node="over",
        state_dir=work / "state",
        socket_path=work / "a.sock",
        host_reserve_bytes=0,
        host_budget_bytes=budget,
        spill_dir=base / "spill",
        sim=SimSettings(root=root, capacity_bytes=len(JOBS) * job_size + (8 << 20), rate_gbps=0),
    )
    agent = await start_agent(settings)
    channel = open_channel(agent.address, token=agent.token)
    stub: Any = agent_pb2_grpc.AgentStub(channel)
    procs = []
    identical, switches, seconds = True, 0, []
    try:
        for seed, name in enumerate(JOBS):
            procs.append(await spawn_job(agent, name, job_size, seed, "bench"))
        crcs = {name: proc.crc for name, proc in zip(JOBS, procs, strict=True)}
        by_name = dict(zip(JOBS, procs, strict=True))
        epoch = 1
        with _Sampler(root / settings.node) as sampler:
            for name in JOBS[1:]:
                await stub.Snapshot(apb.SnapshotRequest(job=name, group="bench", epoch=epoch))
                epoch += 1
            holder = JOBS[0]
            for turn in range(turns * len(JOBS)):
                incoming = JOBS[(turn + 1) % len(JOBS)]
                started = time.perf_counter()
                answer = await stub.Switch(
                    apb.SwitchRequest(
                        group="bench",
                        epoch=epoch,
                        outgoing=[apb.SwitchMove(job=holder)],
                        incoming=apb.SwitchMove(job=incoming),
                    ),
                    timeout=600,
                )
                seconds.append(time.perf_counter() - started)
                epoch += 1
                if answer.HasField("failure"):
                    raise RuntimeError(f"switch {turn}: {answer.failure.reason}")
                switches += 1
                identical &= await by_name[incoming].crc_now() == crcs[incoming]
                holder = incoming
        registry = agent.metrics.registry
        spilled = registry.get_sample_value(
            "rlslice_agent_tier_moved_bytes_total", {"direction": "spill"}
        )
        filled = registry.get_sample_value(
            "rlslice_agent_tier_moved_bytes_total", {"direction": "fill"}
        )
    finally:
        await stop_jobs(procs)
        await channel.close(None)
        await agent.stop(0)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    result: dict[str, Any] = {
        "jobs": len(JOBS),
        "job_bytes": job_size,
        "host_budget_bytes": budget,
        "parked_over_budget": round((len(JOBS) - 1) * job_size / budget, 2),
        "state_over_budget": round(len(JOBS) * job_size / budget, 2),
        "turns_per_job": switches // len(JOBS),
        "identical": identical,
        "parked_host_peak_bytes": sampler.parked_peak,
        "rss_growth_peak_bytes": sampler.rss_peak,
        "parked_plus_rss_peak_bytes": sampler.sum_peak,
        "slack_bytes": slack,
        "spilled_bytes": int(spilled or 0),
        "filled_bytes": int(filled or 0),
        "switch_p50_s": round(sorted(seconds)[len(seconds) // 2], 4) if seconds else None,
    }
    result["ok"] = bool(
        identical
        and switches // len(JOBS) >= turns
        and sampler.parked_peak <= budget
        and sampler.sum_peak <= budget + slack
    )
    return result
