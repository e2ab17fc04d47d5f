"""`rlslice demo`: two RL-shaped jobs, first on dedicated emulated GPUs, then time-sliced on one.

Each job is a driver (this process, one thread per job, using `rlslice.Client`) and a GPU
worker process (`rlslice.apps.demo.worker`) holding a few hundred MiB of emulated device state.
A cycle is rollout on the GPU, reward scoring on the CPU, training on the GPU. The demo
starts `rlslice up` (scheduler + agent, `sim` backend) as a real subprocess; dedicated, each
job has its own group and device, time-sliced both share group `shared` on device 0, whose
capacity holds one job's state: every switch really freezes a worker and copies its bytes.

It prints a progress line while it runs, then a table, writes a timeline PNG, and prints as
its last line one JSON object with the figures. What a run measured is `demo_runs`; the
table, the PNG and the figures are `demo_report`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlslice.apps.demo.report import _print_table, _summary, _write_timeline
from rlslice.apps.demo.runs import JobRun, MiB, ModeRun, Profile
from rlslice.apps.shared.worker_pipe import WorkerPipe
from rlslice.testing import (
    Service,
    child_env,
    free_port,
    rlslice_argv,
    start_service,
    wait_serving,
)


@dataclass
class _Cluster:
    """The `rlslice up` service and where its node lives."""

    service: Service
    scheduler: str
    socket_path: Path
    sim_root: Path
    node: str

    def stop(self) -> None:
        self.service.stop()


def _start_cluster(
    work: Path,
    *,
    devices: int,
    capacity: int,
    rate_gbps: float,
    group_config: Path | None = None,
) -> _Cluster:
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    node = "demo-node"
    sim_root = work / "sim"
    socket_path = work / "agent.sock"
    argv = rlslice_argv(
        "up",
        "--address",
        f"127.0.0.1:{port}",
        "--store",
        str(work / "scheduler.sqlite"),
        "--node",
        node,
        "--socket",
        str(socket_path),
        "--state-dir",
        str(work / "agent-state"),
        "--sim-root",
        str(sim_root),
        "--sim-devices",
        str(devices),
        "--sim-capacity",
        str(capacity),
        "--sim-rate-gbps",
        str(rate_gbps),
        "--host-reserve",
        str(256 * MiB),
    )
    if group_config is not None:
        argv += ["--group-config", str(group_config)]
    service = start_service(argv, work / "up.log")
    cluster = _Cluster(service, f"127.0.0.1:{port}", socket_path, sim_root, node)
    devices_file = sim_root / node / "devices.json"
    # Ready: the scheduler serves, and the agent's socket and emulated devices exist.
    wait_serving(
        cluster.scheduler,
        service,
        ready=lambda: socket_path.exists() and devices_file.exists(),
    )
    return cluster


def _score_rewards(seconds: float, sample: float) -> float:
    """Reward scoring on the CPU: a little real work, then the rest of the phase."""
    deadline = time.perf_counter() + seconds
    reward = 0.0
    for i in range(2000):
        reward += ((sample * 1e3 + i) % 7.0) / 7.0
    left = deadline - time.perf_counter()
    if left > 0:
        time.sleep(left)
    return reward / 2000.0


def _run_job(
    run: JobRun,
    *,
    cluster: _Cluster,
    profile: Profile,
    device: int,
    seed: int,
    window: _Window,
    origin: float,
    barrier: threading.Barrier,
) -> None:
    from rlslice import Client

    worker = _worker(run, cluster, profile, seed, device)
    client = Client(
        job=run.job,
        group=run.group,
        scheduler=cluster.scheduler,
        lease_seconds=15.0,
        device_bytes=profile.state_mib * MiB,
    )
    try:
        with client.phase("load"):
            worker.call(op="init")
        barrier.wait(timeout=120)
        window.ready.wait(timeout=120)
        stop_at = window.stop
        _sleep_until_wall(window.start + profile.start_offset_seconds)
        while time.time() < stop_at:
            began = time.time()
            rollout = _gpu(run, client, worker, origin, "rollout", seconds=profile.rollout_seconds)
            scored = time.time()
            reward = _score_rewards(profile.score_seconds, float(rollout["sample"]))
            run.intervals.append((run.job, scored - origin, time.time() - origin, "cpu:score"))
            answer = _gpu(
                run, client, worker, origin, "train", seconds=profile.train_seconds, reward=reward
            )
            run.checksums.append(int(answer["checksum"]))
            if profile.prepare_seconds > 0:
                prepared = time.time()
                _score_rewards(profile.prepare_seconds, reward)
                run.intervals.append(
                    (run.job, prepared - origin, time.time() - origin, "cpu:prepare")
                )
            run.cycles += 1
            run.cycle_seconds.append(time.time() - began)
            run.cycle_ends.append(time.time() - origin)
    except Exception as error:
        run.error = f"{type(error).__name__}: {error}"
        barrier.abort()
    finally:
        _close_worker(client, worker)
        client.close()


def _close_worker(client: Any, worker: WorkerPipe) -> None:
    """Stop the worker with its state home: a parked worker is frozen and would never
    read its `quit`, so the job takes the group once more (restored), then stops it."""
    try:
        client.acquire(phase="unload")
    except Exception:
        worker.close()  # the scheduler is gone or refused: nothing is parked by it now
        return
    try:
        worker.close()
    finally:
        client.yield_()


def _worker(run: JobRun, cluster: _Cluster, profile: Profile, seed: int, device: int) -> WorkerPipe:
    """The job's GPU worker process, registered with the node's agent on `init`."""
    from rlslice import env as names

    env = child_env(
        {
            names.AGENT_SOCKET: str(cluster.socket_path),
            names.SIM_ROOT: str(cluster.sim_root),
            names.NODE: cluster.node,
            names.JOB: run.job,
        }
    )
    argv = [sys.executable, "-m", "rlslice.apps.demo.worker", run.job, run.group]
    argv += [str(profile.state_mib * MiB), str(seed), str(device)]
    return WorkerPipe(argv, env)


def _gpu(
    run: JobRun, client: Any, worker: WorkerPipe, origin: float, phase: str, **command: Any
) -> dict[str, Any]:
    """One GPU phase: acquire, the worker's `phase` op, yield; the times go into `run`."""
    asked = time.time()
    grant = client.acquire(phase=phase)
    granted = time.time()
    run.wait_seconds += granted - asked
    if grant.switch_seconds > 0 or grant.moved_bytes > 0:
        run.switch_seconds += grant.switch_seconds
        run.moved_bytes += grant.moved_bytes
        run.switches.append(
            (granted - grant.switch_seconds - origin, granted - origin, grant.moved_bytes)
        )
    if granted - asked > 1e-3:
        run.intervals.append((run.job, asked - origin, granted - origin, "wait"))
    try:
        answer: dict[str, Any] = worker.call(op=phase, **command)
    finally:
        done = time.time()
        client.yield_()
    run.gpu_seconds += done - granted
    run.intervals.append((run.job, granted - origin, done - origin, f"gpu:{phase}"))
    return answer


def _sleep_until_wall(when: float) -> None:
    left = when - time.time()
    if left > 0:
        time.sleep(left)


def _run_mode(
    mode: str,
    cluster: _Cluster,
    jobs: list[str],
    profiles: list[Profile],
    seconds: float,
    origin: float,
    progress: _Progress,
) -> ModeRun:
    runs = [
        JobRun(job=job, group=f"dedicated-{i}" if mode == "dedicated" else "shared")
        for i, job in enumerate(jobs)
    ]
    barrier = threading.Barrier(len(jobs) + 1)
    window = _Window()
    threads = []
    for i, run in enumerate(runs):
        thread = threading.Thread(
            target=_run_job,
            args=(run,),
            kwargs={
                "cluster": cluster,
                "profile": profiles[i],
                "device": i if mode == "dedicated" else 0,
                "seed": 1000 + i,
                "window": window,
                "origin": origin,
                "barrier": barrier,
            },
            name=f"demo-{run.job}",
            daemon=True,
        )
        threads.append(thread)
        thread.start()
    # The clock starts once every job has loaded its state, in both modes alike.
    try:
        barrier.wait(timeout=180)
    except threading.BrokenBarrierError:
        pass
    window.start = time.time() + 0.2
    window.stop = window.start + seconds
    window.ready.set()
    progress.begin(mode, runs, window.start, window.stop)
    for thread in threads:
        while thread.is_alive():
            thread.join(timeout=0.5)
            progress.tick()
    progress.end()
    errors = [f"{r.job}: {r.error}" for r in runs if r.error]
    if errors:
        raise RuntimeError(f"{mode} run failed: " + "; ".join(errors))
    # The window is [start, stop]: cycles still running at stop count only up to it.
    return ModeRun(mode, runs, window.start - origin, window.stop - origin)


@dataclass
class _Window:
    """When the measured run starts and stops; set once every job has loaded."""

    start: float = 0.0
    stop: float = 0.0
    ready: threading.Event = field(default_factory=threading.Event)


class _Progress:
    """One live status line on stderr."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._mode = ""
        self._runs: list[JobRun] = []
        self._start = self._stop = 0.0
        self._tty = sys.stderr.isatty()
        self._last = 0.0

    def begin(self, mode: str, runs: list[JobRun], start: float, stop: float) -> None:
        self._mode, self._runs, self._start, self._stop = mode, runs, start, stop

    def tick(self) -> None:
        if not self.enabled:
            return
        now = time.time()
        if not self._tty and now - self._last < 5.0:
            return  # a log, not a terminal: one line every few seconds
        self._last = now
        elapsed = max(0.0, time.time() - self._start)
        total = self._stop - self._start
        cycles = " ".join(f"{r.job}={r.cycles}" for r in self._runs)
        switches = sum(len(r.switches) for r in self._runs)
        line = (
            f"{self._mode:>11}: {min(elapsed, total):5.1f}/{total:.0f}s  cycles {cycles}  "
            f"switches {switches}"
        )
        sys.stderr.write(f"\r{line}   " if self._tty else f"{line}\n")
        sys.stderr.flush()

    def end(self) -> None:
        if self.enabled and self._tty:
            self.tick()
            sys.stderr.write("\n")
            sys.stderr.flush()


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--seconds", type=float, default=30.0, help="length of each run (dedicated, time-sliced)"
    )
    parser.add_argument("--jobs", type=int, default=2, help="number of jobs (2 to 4)")
    parser.add_argument(
        "--rate-gbps", type=float, default=25.0, help="emulated host<->device copy rate, GB/s"
    )
    parser.add_argument(
        "--state-mib",
        type=int,
        help="emulated device state per job, MiB (default 256; 32 with --policy)",
    )
    parser.add_argument("--out", type=Path, default=Path("demo-out"), help="output folder")
    parser.add_argument("--no-progress", action="store_true", help="no live progress line")
    parser.add_argument(
        "--policy",
        metavar="P[,P...]",
        help="run the jobs time-sliced once per waiter-ordering policy (fifo, priority, "
        "fair, lrs, stage) and compare each run with the simulator's prediction; with "
        "--jobs 3 the jobs are the three-jobs scenario's (docs/planner.md)",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=0.01,
        help="with --policy: real seconds per simulated second of the scenario",
    )
    parser.add_argument("--json", action="store_true", help="print only the JSON object, no tables")


def run(args: argparse.Namespace) -> int:
    if not 2 <= args.jobs <= 4:
        print("rlslice demo: --jobs must be between 2 and 4", file=sys.stderr)
        return 2
    if args.seconds < 5:
        print("rlslice demo: --seconds must be at least 5", file=sys.stderr)
        return 2
    if args.policy is not None:
        from rlslice.apps.demo.policies import run_policies

        return run_policies(args)
    profile = Profile(state_mib=256 if args.state_mib is None else args.state_mib)
    jobs = [f"grpo-{chr(ord('a') + i)}" for i in range(args.jobs)]
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    shm = Path("/dev/shm")
    work = Path(tempfile.mkdtemp(prefix="rlslice-demo-", dir=shm if shm.is_dir() else None))
    progress = _Progress(not args.no_progress)
    origin = time.time()
    # One device holds one job's state (plus a little): time-sliced jobs cannot co-reside.
    capacity = profile.state_mib * MiB * 3 // 2
    try:
        # Dedicated: a device per job. Time-sliced: one device for all of them.
        cluster = _start_cluster(
            work / "dedicated", devices=args.jobs, capacity=capacity, rate_gbps=args.rate_gbps
        )
        try:
            dedicated = _run_mode(
                "dedicated", cluster, jobs, [profile] * len(jobs), args.seconds, origin, progress
            )
        finally:
            cluster.stop()
        cluster = _start_cluster(
            work / "sliced", devices=1, capacity=capacity, rate_gbps=args.rate_gbps
        )
        try:
            sliced = _run_mode(
                "time-sliced", cluster, jobs, [profile] * len(jobs), args.seconds, origin, progress
            )
        finally:
            cluster.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    png = _write_timeline(sliced, out / "timeline.png", origin)
    summary = _summary(dedicated, sliced, profile, png)
    if not args.json:
        _print_table(dedicated, sliced, summary)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary))
    return 0
