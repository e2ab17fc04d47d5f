"""`rlslice simulate`: predict what time-slicing does for jobs that share one group."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def configure(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--scenario",
        choices=["article"],
        help="a built-in scenario (default: article, two synchronous GRPO jobs)",
    )
    source.add_argument("--jobs", type=Path, metavar="FILE.yaml", help="jobs and group as YAML")
    parser.add_argument("--policy", choices=["fifo", "priority", "fair"], help="queue order")
    parser.add_argument("--horizon", type=float, metavar="S", help="simulated seconds")
    parser.add_argument("--seed", type=int, help="seed of the duration jitter")
    parser.add_argument("--gpu-gib", type=float, help="device memory per GPU, GiB")
    parser.add_argument("--bandwidth-gb-per-s", type=float, help="host<->device GB/s per GPU")
    parser.add_argument("--overhead-s", type=float, help="fixed seconds per switch")
    parser.add_argument("--timeline", type=Path, metavar="PNG", help="write a timeline PNG")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from rlslice._errors import InvalidArgumentError
    from rlslice.planner.timeline import plot_timeline

    try:
        result = _simulate(args)
    except (InvalidArgumentError, OSError) as error:
        print(f"rlslice simulate: {error}")
        return 2
    if args.timeline is not None:
        plot_timeline(
            result.intervals,
            args.timeline,
            switches=result.switch_markers,
            title=(
                f"{len(result.jobs)} jobs, {result.policy}: busy "
                f"{result.dedicated_busy_fraction:.0%} dedicated -> "
                f"{result.sliced_busy_fraction:.0%} time-sliced"
            ),
        )
    if args.json:
        print(json.dumps(_summary(result), indent=2))
        return 0
    _print(result)
    if args.timeline is not None:
        print(f"timeline: {args.timeline}")
    return 0


def _simulate(args: argparse.Namespace) -> Any:
    """The scenario the flags describe (a jobs file, else the article's), run."""
    import dataclasses

    from rlslice.planner.memory import BYTES_PER_GIB
    from rlslice.planner.scenarios import article_scenario, scenario_from_mapping

    if args.jobs is not None:
        import yaml

        scenario = scenario_from_mapping(yaml.safe_load(args.jobs.read_text()))
    else:
        scenario = article_scenario()
    overrides: dict[str, object] = {}
    if args.gpu_gib is not None:
        overrides["gpu_bytes"] = round(args.gpu_gib * BYTES_PER_GIB)
    if args.bandwidth_gb_per_s is not None:
        overrides["bandwidth_bytes_per_s"] = args.bandwidth_gb_per_s * 1e9
    if args.overhead_s is not None:
        overrides["overhead_s"] = args.overhead_s
    scenario = dataclasses.replace(scenario, **overrides)  # type: ignore[arg-type]
    return scenario.run(policy=args.policy, horizon_s=args.horizon, seed=args.seed)


def _summary(result: Any) -> dict[str, Any]:
    import dataclasses

    return {
        "policy": result.policy,
        "horizon_s": result.horizon_s,
        "dedicated_busy_fraction": result.dedicated_busy_fraction,
        "sliced_busy_fraction": result.sliced_busy_fraction,
        "switches": result.switches,
        "switch_seconds_total": result.switch_seconds_total,
        "moved_bytes_total": result.moved_bytes_total,
        "coresident_grants": result.coresident_grants,
        "jobs": [dataclasses.asdict(job) for job in result.jobs],
    }


def _print(result: Any) -> None:
    print(f"policy {result.policy}, horizon {result.horizon_s:g} s")
    print(
        f"GPU busy: dedicated {result.dedicated_busy_fraction:.1%} per group, "
        f"time-sliced {result.sliced_busy_fraction:.1%} of one group"
    )
    print(
        f"switches: {result.switches} ({result.switch_seconds_total:.1f} s, "
        f"{result.moved_bytes_total / 1e9:.1f} GB moved), "
        f"co-resident grants: {result.coresident_grants}"
    )
    print(f"{'job':<20} {'cycles ded.':>11} {'cycles sliced':>13} {'wait s':>8} {'slowdown':>9}")
    for job in result.jobs:
        print(
            f"{job.name:<20} {job.dedicated_cycles:>11} {job.sliced_cycles:>13} "
            f"{job.wait_seconds:>8.1f} {job.slowdown:>9.3f}"
        )
