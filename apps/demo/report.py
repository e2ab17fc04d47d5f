"""`rlslice demo`'s output: the timeline PNG, the figures, the tables.

From the dedicated and the time-sliced `ModeRun`: `_write_timeline` draws the time-sliced
run, `_summary` is the JSON object of figures, `_print_table` prints the two tables.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlslice.apps.demo.runs import MiB, ModeRun, Profile


def _write_timeline(sliced: ModeRun, path: Path, origin: float) -> str:
    from rlslice.planner.timeline import SwitchMarker, TimelineInterval, plot_timeline

    offset = sliced.started
    lanes = [
        TimelineInterval(job, start - offset, end - offset, kind)
        for run in sliced.jobs
        for job, start, end, kind in run.intervals
        if end - offset >= 0
    ]
    switches = [
        SwitchMarker(start - offset, end - offset, moved_bytes=moved)
        for run in sliced.jobs
        for start, end, moved in run.switches
    ]
    plot_timeline(lanes, path, switches=switches, title="rlslice demo: time-sliced on one GPU")
    return str(path)


def _summary(dedicated: ModeRun, sliced: ModeRun, profile: Profile, png: str) -> dict[str, Any]:
    per_job = []
    for d, s in zip(dedicated.jobs, sliced.jobs, strict=True):
        per_job.append(
            {
                "job": d.job,
                "dedicated_cycles": d.cycles,
                "sliced_cycles": s.cycles,
                "dedicated_mean_cycle_seconds": round(d.mean_cycle, 3),
                "sliced_mean_cycle_seconds": round(s.mean_cycle, 3),
                "slowdown": round(s.mean_cycle / d.mean_cycle, 3) if d.mean_cycle else None,
            }
        )
    return {
        "dedicated_busy_fraction": round(dedicated.busy_fraction(), 4),
        "sliced_busy_fraction": round(sliced.busy_fraction(), 4),
        "gpus_dedicated": len(dedicated.jobs),
        "gpus_sliced": 1,
        "switches": sliced.switches,
        "switch_seconds_total": round(sliced.switch_seconds, 3),
        "handoff_overhead_seconds": round(sliced.handoff_overhead(), 4),
        "moved_bytes": sliced.moved_bytes,
        "state_bytes_per_job": profile.state_mib * MiB,
        "profile": {
            "rollout_seconds": profile.rollout_seconds,
            "score_seconds": profile.score_seconds,
            "train_seconds": profile.train_seconds,
            "device_capacity_bytes": profile.state_mib * MiB * 3 // 2,
        },
        "seconds_per_run": round(sliced.wall, 2),
        "jobs": per_job,
        "timeline_png": png,
    }


def _print_table(dedicated: ModeRun, sliced: ModeRun, summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=False)
    jobs = Table(title="Jobs: dedicated GPUs vs one time-sliced GPU")
    for column in (
        "job",
        "cycles (ded.)",
        "cycles (sliced)",
        "mean cycle s (ded.)",
        "mean cycle s (sliced)",
        "slowdown",
    ):
        jobs.add_column(column, justify="right")
    for row in summary["jobs"]:
        jobs.add_row(
            row["job"],
            str(row["dedicated_cycles"]),
            str(row["sliced_cycles"]),
            f"{row['dedicated_mean_cycle_seconds']:.2f}",
            f"{row['sliced_mean_cycle_seconds']:.2f}",
            f"{row['slowdown']:.2f}x" if row["slowdown"] else "-",
        )
    console.print(jobs)
    totals = Table(title="GPU use")
    totals.add_column("")
    totals.add_column("dedicated", justify="right")
    totals.add_column("time-sliced", justify="right")
    totals.add_row("GPUs", str(len(dedicated.jobs)), "1")
    totals.add_row(
        "GPU busy fraction",
        f"{summary['dedicated_busy_fraction']:.2f}",
        f"{summary['sliced_busy_fraction']:.2f}",
    )
    totals.add_row("switches", str(dedicated.switches), str(sliced.switches))
    totals.add_row(
        "seconds switching", f"{dedicated.switch_seconds:.2f}", f"{sliced.switch_seconds:.2f}"
    )
    totals.add_row(
        "bytes moved",
        f"{dedicated.moved_bytes / MiB:.0f} MiB",
        f"{sliced.moved_bytes / MiB:.0f} MiB",
    )
    console.print(totals)
    console.print(f"timeline: {summary['timeline_png']}")
