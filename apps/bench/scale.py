"""`rlslice bench scale`: does the scheduler's own cost per acquire stay flat from 10 to 1,000 groups?

For each `--groups` count (default 10 then 1,000) a fresh scheduler runs in a SUBPROCESS (so
its CPU time and resident memory can be read alone, with psutil), in-memory store, groups
created on first Register. A driver process (asyncio, raw gRPC stubs, `--channels` channels
shared by every job) registers `groups × --jobs` jobs, then each job loops for `--seconds`:
acquire, hold for a random GPU phase, yield, then a random CPU phase. Phase lengths are
scaled so that every configuration offers the same total load (`--rate` acquires per second
over all groups) with each group busy about half the time: the configurations differ in how
many groups and jobs the scheduler keeps, not in how hard it is driven.

Figures, per configuration:

- **acquire overhead** = client round trip of Acquire − `Grant.waited_seconds`. The scheduler
  measures `waited_seconds` from queueing to grant: time behind another job's hold and the
  switch (no agents here, so a switch moves nothing). What remains is transport plus the
  scheduler's own work for the call: the cost it adds to every acquire, contended or not.
  p50 and p99.
- immediate acquires (granted at once: no queue, no switch, the job still resident): their
  share and round trip; Yield round trip; a GetGroup probe (a read-only call at a steady
  20/s: transport plus the event loop's delay).
- scheduler CPU seconds over the measured window and per call (Acquire + Yield), resident
  memory after registration, at the end and at its peak (VmHWM); events kept in the rings,
  RSS growth per event, and the RSS projected for full rings (an estimate, labelled so).
- why a p99 moves: the scheduler's event-loop lag and garbage-collector pauses, measured
  inside its process, and the driver's own loop lag.

The driver is the measuring instrument, so it keeps its own noise out: all job tasks exist
before the window opens, and its garbage collector is frozen and off during the window.
Each count runs `--rounds` times, alternating between counts so that a slow spell of a
shared machine hits both; the round with the lowest p99 is reported, with every round's p99.

Targets (issue 8): p99 overhead at the largest count ≤ 2 × the p99 at the smallest; scheduler
RSS ≤ 200 MiB. `--check` exits 1 when a target is missed. `--profile DIR` writes a cProfile
of each scheduler run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rlslice.apps.bench._scale_figures import (
    P99_RATIO_TARGET,
    RSS_TARGET_MIB,
    Result,
    best_round,
    parse_groups,
    verdict,
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--groups",
        default="10,1000",
        help="comma-separated group counts; the first is the baseline (default 10,1000)",
    )
    parser.add_argument("--jobs", type=int, default=8, help="jobs per group (default 8)")
    parser.add_argument(
        "--seconds", type=float, default=15.0, help="measured seconds per round (default 15)"
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=300.0,
        help="acquires per second offered over all groups (default 300)",
    )
    parser.add_argument(
        "--channels", type=int, default=4, help="gRPC channels the driver shares (default 4)"
    )
    parser.add_argument("--seed", type=int, default=1, help="random seed of the phases")
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="rounds per group count, alternating; the best round is reported (default 2)",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="profile each scheduler with cProfile into DIR/scheduler-<groups>.prof",
    )


def machine() -> dict[str, Any]:
    """The machine the figures come from."""
    import grpc

    model = ""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next(
                (line.split(":", 1)[1].strip() for line in cpuinfo if "model name" in line), ""
            )
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model or platform.processor(),
        "python": platform.python_version(),
        "grpcio": grpc.__version__,
        "platform": platform.platform(),
    }


def run(args: argparse.Namespace) -> int:
    from rlslice.apps.bench._scale_driver import measure

    try:
        counts = parse_groups(args.groups)
    except ValueError as error:
        print(f"bench scale: {error}", file=sys.stderr)
        return 2
    for flag, value in (("--jobs", args.jobs), ("--channels", args.channels)):
        if value < 1:
            print(f"bench scale: {flag}: must be 1 or more", file=sys.stderr)
            return 2
    if args.seconds <= 0 or args.rate <= 0:
        print("bench scale: --seconds and --rate must be above 0", file=sys.stderr)
        return 2
    if args.rounds < 1:
        print("bench scale: --rounds: must be 1 or more", file=sys.stderr)
        return 2
    rounds: dict[int, list[Result]] = {count: [] for count in counts}
    for round_index in range(args.rounds):
        for count in counts:  # alternating, so slow spells of the machine hit both
            if not args.json:
                print(
                    f"scale: round {round_index + 1}/{args.rounds}: {count} groups × "
                    f"{args.jobs} jobs for {args.seconds:g} s ...",
                    flush=True,
                )
            profile = (
                str(Path(args.profile) / f"scheduler-{count}-{round_index + 1}.prof")
                if args.profile
                else None
            )
            rounds[count].append(
                measure(
                    count, args.jobs, args.seconds, args.rate, args.channels, args.seed, profile
                )
            )
    results = [best_round(rounds[count]) for count in counts]
    figures = verdict(results)
    report = {
        "bench": "scale",
        "overhead": "Acquire round trip - Grant.waited_seconds (queue and switch)",
        "rounds": args.rounds,
        "chosen": "per group count, the round with the lowest p99 overhead (best of rounds)",
        "rate": args.rate,
        "machine": machine(),
        "results": [asdict(r) for r in results],
        "targets": figures,
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_table(results, figures)
    met = figures["p99_overhead_ratio_met"] and figures["rss_met"]
    return 1 if args.check and not met else 0


def _cell(fmt: str, value: Any) -> str:
    if isinstance(value, tuple):
        return " / ".join(f"{v:.1f}" for v in value)
    return fmt.format(value)


def _print_table(results: Sequence[Result], figures: dict[str, Any]) -> None:
    rows = [
        ("acquires measured", "acquires", "{:.0f}"),
        ("acquire overhead p50 (ms)", "overhead_p50_ms", "{:.3f}"),
        ("acquire overhead p99 (ms)", "overhead_p99_ms", "{:.3f}"),
        ("  p99 of each round (ms)", "overhead_p99_rounds_ms", "{}"),
        ("acquires granted at once (share)", "immediate_share", "{:.2f}"),
        ("  their round trip p50 (ms)", "immediate_p50_ms", "{:.3f}"),
        ("  their round trip p99 (ms)", "immediate_p99_ms", "{:.3f}"),
        ("yield p50 (ms)", "yield_p50_ms", "{:.3f}"),
        ("yield p99 (ms)", "yield_p99_ms", "{:.3f}"),
        ("GetGroup probe p50 (ms)", "probe_p50_ms", "{:.3f}"),
        ("GetGroup probe p99 (ms)", "probe_p99_ms", "{:.3f}"),
        ("register all jobs (s)", "register_seconds", "{:.2f}"),
        ("scheduler CPU (s)", "scheduler_cpu_seconds", "{:.2f}"),
        ("scheduler CPU per call (µs)", "scheduler_cpu_us_per_call", "{:.0f}"),
        ("scheduler RSS idle (MiB)", "scheduler_rss_idle_mib", "{:.1f}"),
        ("scheduler RSS end (MiB)", "scheduler_rss_mib", "{:.1f}"),
        ("scheduler RSS peak (MiB)", "scheduler_peak_rss_mib", "{:.1f}"),
        ("scheduler loop lag p99 (ms)", "loop_lag_p99_ms", "{:.1f}"),
        ("scheduler loop lag max (ms)", "loop_lag_max_ms", "{:.1f}"),
        ("scheduler full GCs", "gc_full_collections", "{:.0f}"),
        ("scheduler full GC pause max (ms)", "gc_full_pause_max_ms", "{:.1f}"),
        ("scheduler GC-tracked objects", "gc_tracked_objects", "{:.0f}"),
        ("events kept at the end", "events_kept", "{:.0f}"),
        ("RSS growth per event (bytes, est.)", "rss_bytes_per_event", "{:.0f}"),
        ("RSS with full rings (MiB, projected)", "projected_full_ring_rss_mib", "{:.0f}"),
        ("driver loop lag max (ms)", "driver_loop_lag_max_ms", "{:.1f}"),
        ("driver full GC pause max (ms)", "driver_gc_full_pause_max_ms", "{:.1f}"),
        ("errors", "errors", "{:.0f}"),
    ]
    header = ["", *(f"{r.groups} groups" for r in results)]
    table = [header] + [
        [label, *(_cell(fmt, getattr(r, key)) for r in results)] for label, key, fmt in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print(
            "  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    ok = {True: "met", False: "MISSED"}
    print(
        f"p99 overhead ratio {figures['p99_overhead_ratio']:.2f} "
        f"(target ≤ {P99_RATIO_TARGET:g}: {ok[figures['p99_overhead_ratio_met']]}); "
        f"peak RSS {figures['peak_rss_mib']:.1f} MiB "
        f"(target ≤ {RSS_TARGET_MIB:g}: {ok[figures['rss_met']]})"
    )
