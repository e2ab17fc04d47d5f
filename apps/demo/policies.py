"""`rlslice demo --jobs 3 --policy fifo,lrs,stage`: the policies on real processes.

The jobs (with `--jobs 3`, the planner's three-jobs scenario, `THREE_JOBS`, its seconds
times `--time-scale`; otherwise the default demo job) run time-sliced on one emulated
GPU, once per policy, each run on a fresh `rlslice up` whose group `shared` has that
policy and declares `rollout` and `train` as phase kinds (early yield off: the demo's
phases have no safe points). Each run is measured (the group's GPU busy fraction, every
job's mean step time) and compared with the interleaving simulator's prediction for the
same jobs, ordered by the scheduler's own policy code, given the switch cost the run
measured (its copy rate and each handoff's round trips). The jobs start `OFFSET_STEP_S`
seconds apart, in the run and in the simulator alike, so their first acquires do not race.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rlslice.apps.demo.command import _Progress, _run_mode, _start_cluster
from rlslice.apps.demo.report import _write_timeline
from rlslice.apps.demo.runs import MiB, ModeRun, Profile

#: Real seconds between the jobs' first cycles (the simulator offsets them alike).
OFFSET_STEP_S = 0.15
PHASE_KINDS = {"rollout": "rollout", "train": "train"}


def _jobs(count: int, scale: float, state_mib: int) -> list[tuple[str, Profile]]:
    """The demo's jobs: the three-jobs scenario's for three, else the default job."""
    from rlslice.planner.scenarios import THREE_JOBS

    if count == 3:
        shapes = [
            (name, Profile(r * scale, c1 * scale, t * scale, state_mib, p * scale))
            for name, r, c1, t, p in THREE_JOBS
        ]
    else:
        shapes = [(f"grpo-{chr(ord('a') + i)}", Profile(state_mib=state_mib)) for i in range(count)]
    return [(name, _offset(profile, i * OFFSET_STEP_S)) for i, (name, profile) in enumerate(shapes)]


def _offset(profile: Profile, seconds: float) -> Profile:
    import dataclasses

    return dataclasses.replace(profile, start_offset_seconds=seconds)


def _group_config(path: Path, policy: str) -> Path:
    import yaml

    group = {
        "name": "shared",
        "policy": policy,
        "phases": {name: {"kind": kind} for name, kind in PHASE_KINDS.items()},
        "early_yield": False,
    }
    path.write_text(yaml.safe_dump({"groups": [group]}))
    return path


def run_policies(args: argparse.Namespace) -> int:
    """Run the jobs once per policy in `args.policy`; print the table and one JSON line."""
    from rlslice.apps.shared.sim_policies import POLICY_NAMES

    policies = [name.strip() for name in args.policy.split(",")]
    bad = [name for name in policies if name not in POLICY_NAMES]
    if bad or len(set(policies)) != len(policies):
        print(
            f"rlslice demo: --policy takes distinct names of {', '.join(POLICY_NAMES)}",
            file=sys.stderr,
        )
        return 2
    if not 0 < args.time_scale <= 1:
        print("rlslice demo: --time-scale must be in (0, 1]", file=sys.stderr)
        return 2
    state_mib = 32 if args.state_mib is None else args.state_mib
    jobs = _jobs(args.jobs, args.time_scale, state_mib)
    names = [name for name, _ in jobs]
    profiles = [profile for _, profile in jobs]
    capacity = state_mib * MiB * 3 // 2  # one job's state at a time: every grant switches
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    shm = Path("/dev/shm")
    work = Path(tempfile.mkdtemp(prefix="rlslice-demo-", dir=shm if shm.is_dir() else None))
    progress = _Progress(not args.no_progress)
    origin = time.time()
    figures: dict[str, Any] = {}
    try:
        for policy in policies:
            cluster = _start_cluster(
                work / policy,
                devices=1,
                capacity=capacity,
                rate_gbps=args.rate_gbps,
                group_config=_group_config(work / f"{policy}.yaml", policy),
            )
            try:
                sliced = _run_mode(policy, cluster, names, profiles, args.seconds, origin, progress)
            finally:
                cluster.stop()
            png = _write_timeline(sliced, out / f"timeline-{policy}.png", origin)
            figures[policy] = _figures(policy, sliced, profiles, capacity, png)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = {
        "scenario": "three-jobs" if args.jobs == 3 else "grpo",
        "time_scale": args.time_scale if args.jobs == 3 else 1.0,
        "state_bytes_per_job": state_mib * MiB,
        "device_capacity_bytes": capacity,
        "seconds_per_run": args.seconds,
        "policies": figures,
    }
    if not args.json:
        _print_table(summary)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary))
    return 0


def _figures(
    policy: str, sliced: ModeRun, profiles: list[Profile], capacity: int, png: str
) -> dict[str, Any]:
    """One run measured, and the simulator's prediction of it. A job's step time is the
    simulator's: the mean cycle of those that ended within the window."""
    from rlslice.planner.jobs import mean_step

    steps = [
        mean_step(
            sliced.started + profile.start_offset_seconds,
            [end for end in run.cycle_ends if end <= sliced.ended],
        )
        for run, profile in zip(sliced.jobs, profiles, strict=True)
    ]
    switch_seconds = sliced.switch_seconds
    rate = sliced.moved_bytes / switch_seconds if switch_seconds > 0 else 25e9
    handoff = sliced.handoff_overhead()
    predicted = predict(policy, sliced, profiles, capacity, rate, handoff)
    return {
        "busy": round(sliced.busy_fraction(), 4),
        "min_step_seconds": round(min((s for s in steps if s > 0), default=0.0), 4),
        "predicted_busy": round(predicted.sliced_busy_fraction, 4),
        "predicted_min_step_seconds": round(predicted.min_step_seconds, 4),
        "switches": sliced.switches,
        "switch_seconds_total": round(switch_seconds, 3),
        "moved_bytes": sliced.moved_bytes,
        "handoff_overhead_seconds": round(handoff, 4),
        "jobs": [
            {
                "job": run.job,
                "cycles": sum(1 for end in run.cycle_ends if end <= sliced.ended),
                "step_seconds": round(step, 4),
                "predicted_step_seconds": round(job.step_seconds, 4),
            }
            for run, step, job in zip(sliced.jobs, steps, predicted.jobs, strict=True)
        ],
        "timeline_png": png,
    }


def predict(
    policy: str,
    sliced: ModeRun,
    profiles: list[Profile],
    capacity: int,
    rate: float,
    handoff: float,
) -> Any:
    """The simulator's figures for the run: its jobs (no jitter, the same start offsets),
    the emulated GPU, the measured switch cost, the run's window as the horizon."""
    from rlslice.apps.shared.sim_policies import phase_table, picker
    from rlslice.planner.interleave import JobProfile, Phase, simulate_interleaving

    jobs = []
    for run, profile in zip(sliced.jobs, profiles, strict=True):
        state = profile.state_mib * MiB
        phases = [
            Phase("rollout", "gpu", profile.rollout_seconds, device_bytes=state),
            Phase("reward", "cpu", profile.score_seconds),
            Phase("train", "gpu", profile.train_seconds, device_bytes=state),
        ]
        if profile.prepare_seconds > 0:
            phases.append(Phase("prepare", "cpu", profile.prepare_seconds))
        jobs.append(JobProfile(run.job, tuple(phases), offset_s=profile.start_offset_seconds))
    return simulate_interleaving(
        jobs,
        gpu_bytes=capacity,
        bandwidth_bytes_per_s=rate,
        overhead_s=handoff,
        policy=policy,
        horizon_s=sliced.wall,
        picker=picker(policy, phase_table(PHASE_KINDS)),
    )


def _print_table(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{summary['scenario']}: measured / simulated, one GPU")
    for column in ("policy", "busy", "min step s", "step s per job", "switches"):
        table.add_column(column, justify="right")
    for policy, row in summary["policies"].items():
        table.add_row(
            policy,
            f"{row['busy']:.3f} / {row['predicted_busy']:.3f}",
            f"{row['min_step_seconds']:.3f} / {row['predicted_min_step_seconds']:.3f}",
            ", ".join(
                f"{job['job']} {job['step_seconds']:.2f}/{job['predicted_step_seconds']:.2f}"
                for job in row["jobs"]
            ),
            str(row["switches"]),
        )
    Console().print(table)
