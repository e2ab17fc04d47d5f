"""`rlslice plan FILE.yaml`: check whether jobs fit on nodes; exit 1 when a group does not."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, metavar="FILE.yaml", help="nodes, groups and jobs")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    import yaml

    from rlslice._errors import InvalidArgumentError
    from rlslice.planner.capacity import plan_from_mapping

    try:
        plan = plan_from_mapping(yaml.safe_load(args.file.read_text()))
    except (InvalidArgumentError, OSError, yaml.YAMLError) as error:
        print(f"rlslice plan: {error}")
        return 2
    if args.json:
        print(json.dumps(_as_json(plan), indent=2))
    else:
        _print(plan)
    return 0 if plan.fits else 1


def _as_json(plan: Any) -> dict[str, Any]:
    return {
        "fits": plan.fits,
        "groups": [
            {
                "name": g.name,
                "fits": g.verdict.fits,
                "reason": g.verdict.reason,
                "usable_gpu_bytes": g.usable_gpu_bytes,
                "jobs": {
                    j.name: {"peak_phase": j.peak_phase, "phase_bytes": dict(j.phase_bytes)}
                    for j in g.jobs
                },
                "host_bytes": {n: list(v) for n, v in g.host_bytes.items()},
                "coresident_pairs": [list(p) for p in g.coresident_pairs],
                "switch_seconds": {f"{a}->{b}": s for (a, b), s in g.switch_seconds.items()},
            }
            for g in plan.groups
        ],
    }


def _print(plan: Any) -> None:
    from rlslice.planner.memory import human_bytes

    for group in plan.groups:
        mark = "fits" if group.verdict.fits else "DOES NOT FIT"
        print(f"group {group.name}: {mark} ({human_bytes(group.usable_gpu_bytes)} usable per GPU)")
        for job in group.jobs:
            phases = ", ".join(f"{name} {human_bytes(b)}" for name, b in job.phase_bytes.items())
            print(f"  job {job.name}: per GPU {phases}; peak in {job.peak_phase}")
        for node, (needed, available) in group.host_bytes.items():
            print(
                f"  node {node}: parking every job needs {human_bytes(needed)} of "
                f"{human_bytes(available)} host memory"
            )
        pairs = ", ".join(f"{a}+{b}" for a, b in group.coresident_pairs) or "none"
        print(f"  co-resident pairs: {pairs}")
        print(f"  worst switch: {group.max_switch_seconds:.2f} s")
        if not group.verdict.fits:
            for problem in group.problems:
                print(f"  reason: {problem}")
