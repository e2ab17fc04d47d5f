"""`rlslice simulate`: predict what time-slicing does for jobs that share one group.

`--policy fifo,lrs,stage` simulates the same jobs once per policy, side by side; each
policy orders the simulated queue with the scheduler's own code
(`rlslice.apps.shared.sim_policies`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def configure(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--scenario",
        choices=["article", "three-jobs"],
        help="a built-in scenario (default: article, two synchronous GRPO jobs; three-jobs: "
        "three RL jobs with unequal phases, docs/planner.md)",
    )
    source.add_argument("--jobs", type=Path, metavar="FILE.yaml", help="jobs and group as YAML")
    parser.add_argument(
        "--policy",
        metavar="P[,P...]",
        help="queue order, or several side by side: fifo, priority, fair, lrs, stage",
    )
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
        policies = _policies(args.policy)
        results = [_simulate(args, policy) for policy in policies]
    except (InvalidArgumentError, OSError) as error:
        print(f"rlslice simulate: {error}")
        return 2
    if len(results) > 1:
        if args.timeline is not None:
            print("rlslice simulate: --timeline takes one policy")
            return 2
        return _compare(results, args.json)
    result = results[0]
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


def _policies(value: str | None) -> list[str | None]:
    """`--policy a,b`: the names, each a scheduler policy; None: the scenario's own."""
    from rlslice._errors import InvalidArgumentError
    from rlslice.apps.shared.sim_policies import POLICY_NAMES

    if value is None:
        return [None]
    names = [name.strip() for name in value.split(",")]
    for name in names:
        if name not in POLICY_NAMES:
            raise InvalidArgumentError(
                f"--policy: {name!r} is not one of {', '.join(POLICY_NAMES)}"
            )
    if len(set(names)) != len(names):
        raise InvalidArgumentError("--policy: a policy is named twice")
    return list(names)


def _simulate(args: argparse.Namespace, policy: str | None) -> Any:
    """The scenario the flags describe (a jobs file, else a built-in one), run under
    `policy` (None: the scenario's) ordered by the scheduler's policy code."""
    import dataclasses

    from rlslice.apps.shared.sim_policies import phase_table, picker
    from rlslice.planner.memory import BYTES_PER_GIB
    from rlslice.planner.scenarios import SCENARIOS, scenario_from_mapping

    if args.jobs is not None:
        import yaml

        scenario = scenario_from_mapping(yaml.safe_load(args.jobs.read_text()))
    else:
        scenario = SCENARIOS[args.scenario or "article"]()
    overrides: dict[str, object] = {}
    if args.gpu_gib is not None:
        overrides["gpu_bytes"] = round(args.gpu_gib * BYTES_PER_GIB)
    if args.bandwidth_gb_per_s is not None:
        overrides["bandwidth_bytes_per_s"] = args.bandwidth_gb_per_s * 1e9
    if args.overhead_s is not None:
        overrides["overhead_s"] = args.overhead_s
    scenario = dataclasses.replace(scenario, **overrides)  # type: ignore[arg-type]
    name = scenario.policy if policy is None else policy
    return scenario.run(
        policy=name,
        horizon_s=args.horizon,
        seed=args.seed,
        picker=picker(name, phase_table(scenario.phase_kinds)),
    )


def _summary(result: Any) -> dict[str, Any]:
    import dataclasses

    return {
        "policy": result.policy,
        "horizon_s": result.horizon_s,
        "busy": result.sliced_busy_fraction,
        "min_step_seconds": result.min_step_seconds,
        "dedicated_busy_fraction": result.dedicated_busy_fraction,
        "sliced_busy_fraction": result.sliced_busy_fraction,
        "switches": result.switches,
        "switch_seconds_total": result.switch_seconds_total,
        "moved_bytes_total": result.moved_bytes_total,
        "coresident_grants": result.coresident_grants,
        "jobs": [dataclasses.asdict(job) for job in result.jobs],
    }


def _compare(results: list[Any], as_json: bool) -> int:
    """Several policies over the same jobs: each one's figures, and each against fifo."""
    summaries = {r.policy: _summary(r) for r in results}
    base = next((r for r in results if r.policy == "fifo"), None)
    versus: dict[str, dict[str, Any]] = {}
    if base is not None:
        for result in results:
            steps = {job.name: job.step_seconds for job in base.jobs}
            versus[result.policy] = {
                "min_step_improvement": _improvement(
                    base.min_step_seconds, result.min_step_seconds
                ),
                "max_slowdown": max(
                    (job.step_seconds / steps[job.name] for job in result.jobs if steps[job.name]),
                    default=1.0,
                ),
            }
    if as_json:
        print(json.dumps({"policies": summaries, "versus_fifo": versus}, indent=2))
        return 0
    print(f"{len(results[0].jobs)} jobs, horizon {results[0].horizon_s:g} s")
    names = [job.name for job in results[0].jobs]
    header = f"{'policy':<10} {'busy':>6} {'min step s':>11}"
    header += "".join(f" {name[:16]:>16}" for name in names)
    print(header + (f" {'vs fifo':>8} {'slowest':>8}" if versus else ""))
    for result in results:
        line = f"{result.policy:<10} {result.sliced_busy_fraction:>6.3f} "
        line += f"{result.min_step_seconds:>11.1f}"
        line += "".join(f" {job.step_seconds:>16.1f}" for job in result.jobs)
        if versus:
            against = versus[result.policy]
            line += f" {against['min_step_improvement']:>+8.1%} {against['max_slowdown']:>7.3f}x"
        print(line)
    print("per job: mean step (cycle) seconds; vs fifo: how much shorter the min step is")
    return 0


def _improvement(base: float, other: float) -> float:
    """How much shorter `other` is than `base`, as a fraction of `base` (0 when unknown)."""
    return (base - other) / base if base > 0 and other > 0 else 0.0


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
    print(
        f"{'job':<20} {'cycles ded.':>11} {'cycles sliced':>13} {'wait s':>8} {'slowdown':>9} "
        f"{'step s':>8}"
    )
    for job in result.jobs:
        print(
            f"{job.name:<20} {job.dedicated_cycles:>11} {job.sliced_cycles:>13} "
            f"{job.wait_seconds:>8.1f} {job.slowdown:>9.3f} {job.step_seconds:>8.1f}"
        )
