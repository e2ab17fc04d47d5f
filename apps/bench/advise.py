"""`rlslice bench advise`: how fast the placement advisor is, and how close its heuristic
comes to the exhaustive best.

- search time: `--jobs` (32) random RL-shaped jobs (rollout, CPU scoring, training; state
  8-40 GiB on 80 GiB GPUs) advised with the heuristic, best of `--repeat` runs;
- gap: `--cases` random cases of `--small-jobs` jobs (the exhaustive search's size),
  each advised by the heuristic and by the exhaustive search; the gap is
  `1 - heuristic / exhaustive` of the fleet busy fraction (0: the heuristic found the best).

Jobs are drawn from a seeded stream, so a run repeats exactly (the times aside).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

from rlslice.planner.advisor import Hardware, advise
from rlslice.planner.profile import WorkloadProfile

GIB = 1 << 30
#: the hardware of every case: an 80 GiB GPU, a 1 TiB host, 25 GB/s, 0.5 s per switch
HARDWARE = Hardware(
    gpu_bytes=80 * GIB, host_bytes=1024 * GIB, bandwidth_bytes_per_s=25e9, overhead_s=0.5
)


def random_jobs(count: int, rng: random.Random) -> list[WorkloadProfile]:
    """`count` RL-shaped jobs: GPU share 10-90% of a 3-40 s cycle, state 8-40 GiB."""
    jobs = []
    for index in range(count):
        cycle = rng.uniform(3.0, 40.0)
        gpu = cycle * rng.uniform(0.1, 0.9)
        rollout = gpu * rng.uniform(0.4, 0.8)
        jobs.append(
            WorkloadProfile.model_validate(
                {
                    "name": f"job-{index:02d}",
                    "rollout_seconds": round(rollout, 3),
                    "cpu_seconds": round(cycle - gpu, 3),
                    "train_seconds": round(gpu - rollout, 3),
                    "state_bytes": rng.randrange(8, 41) * GIB,
                    "max_slowdown": rng.choice([1.1, 1.2, 1.2, 1.5]),
                }
            )
        )
    return jobs


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, default=32, help="jobs of the timed case (32)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs; the best counts")
    parser.add_argument("--cases", type=int, default=20, help="small cases for the gap (20)")
    parser.add_argument("--small-jobs", type=int, default=8, help="jobs per small case (8)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random jobs")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """The figures as one dict."""
    rng = random.Random(args.seed)
    jobs = random_jobs(args.jobs, rng)
    times = []
    for _ in range(max(1, args.repeat)):
        began = time.perf_counter()
        big = advise(jobs, HARDWARE, exhaustive_jobs=0)
        times.append(time.perf_counter() - began)
    gaps = []
    for _ in range(args.cases):
        case = random_jobs(args.small_jobs, rng)
        heuristic = advise(case, HARDWARE, exhaustive_jobs=0).busy_fraction
        exact = advise(case, HARDWARE, exhaustive_jobs=len(case)).busy_fraction
        gaps.append(max(0.0, 1 - heuristic / exact) if exact > 0 else 0.0)
    return {
        "jobs": args.jobs,
        "search_seconds": round(min(times), 3),
        "search_seconds_all": [round(t, 3) for t in times],
        "groups": len(big.groups),
        "busy_dedicated": round(big.dedicated_busy_fraction, 4),
        "busy_advised": round(big.busy_fraction, 4),
        "simulated": big.evaluations,
        "pruned": big.pruned,
        "cases": args.cases,
        "small_jobs": args.small_jobs,
        "gap_mean": round(sum(gaps) / len(gaps), 4) if gaps else None,
        "gap_max": round(max(gaps), 4) if gaps else None,
        "cases_at_optimum": sum(1 for g in gaps if g < 1e-9),
    }


def run(args: argparse.Namespace) -> int:
    figures = measure(args)
    if args.json:
        print(json.dumps(figures))
        return 0
    print(
        f"{figures['jobs']} jobs advised in {figures['search_seconds']:.2f} s "
        f"(best of {len(figures['search_seconds_all'])}; {figures['simulated']} groups simulated, "
        f"{figures['pruned']} pruned): {figures['groups']} groups, fleet busy "
        f"{figures['busy_dedicated']:.2f} dedicated -> {figures['busy_advised']:.2f}"
    )
    if figures["cases"]:
        print(
            f"heuristic vs exhaustive on {figures['cases']} cases of {figures['small_jobs']} jobs: "
            f"gap mean {figures['gap_mean']:.2%}, max {figures['gap_max']:.2%}, "
            f"{figures['cases_at_optimum']} at the optimum"
        )
    return 0
