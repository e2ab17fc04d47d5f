"""`rlslice bench swap`'s report: the swaps' medians, the targets, the text. Pure.

What `rlslice.apps.bench.swap` measured (`_Rounds`) becomes one report dict: seconds and
GB/s per direction beside the pinned memcpy, bit-identical losses, the side passes (the
cuda-checkpoint CLI, the cuda copy paths, the overlapped switches) and the targets each
can judge; `_text` prints it.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Rounds:
    """What the swaps of one bench run measured."""

    losses: dict[int, list[str]]
    snapshots: list[tuple[int, float]] = field(default_factory=list)
    restores: list[tuple[int, float]] = field(default_factory=list)
    overlapped: list[float] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    """Reports of the side passes: the CLI comparison, the cuda copy paths."""


def _summary(outcomes: list[tuple[int, float]], warmup: int) -> dict[str, Any]:
    """Median of the moves after the first `warmup` ones (all of them when too few)."""
    warmup = min(warmup, len(outcomes) - 1)
    steady = outcomes[warmup:]
    seconds = statistics.median(s for _, s in steady)
    nbytes = int(statistics.median(b for b, _ in steady))
    return {
        "bytes": nbytes,
        "seconds_median": seconds,
        "gb_per_s": nbytes / seconds / 1e9 if seconds > 0 else None,
        "seconds_all": [round(s, 6) for _, s in outcomes],
        "warmup": warmup,
    }


def _report(
    args: argparse.Namespace,
    rounds: _Rounds,
    alone: tuple[list[str], list[str]],
    memcpy: dict[str, float],
) -> dict[str, Any]:
    snap = _summary(rounds.snapshots, warmup=2)
    rest = _summary(rounds.restores, warmup=0)
    pids = rounds.extra["workers"]
    identical = {
        "a": rounds.losses[pids["a"]] == alone[0],
        "b": rounds.losses[pids["b"]] == alone[1],
    }
    report: dict[str, Any] = {
        "backend": args.backend,
        "gib": args.gib,
        "swaps": args.swaps,
        "steps_per_turn": args.steps,
        "snapshot_d2h": snap,
        "restore_h2d": rest,
        "pinned_memcpy": {
            "bytes": snap["bytes"],
            "d2h_seconds": memcpy["d2h"],
            "h2d_seconds": memcpy["h2d"],
            "d2h_gb_per_s": snap["bytes"] / memcpy["d2h"] / 1e9,
            "h2d_gb_per_s": snap["bytes"] / memcpy["h2d"] / 1e9,
        },
        "ratio_to_memcpy": {
            "d2h": snap["seconds_median"] / memcpy["d2h"],
            "h2d": rest["seconds_median"] / memcpy["h2d"],
        },
        "bit_identical": identical,
        "losses_compared": {"a": len(alone[0]), "b": len(alone[1])},
    }
    differences = {
        name: _first_difference(rounds.losses[pids[name]], reference)
        for name, reference in (("a", alone[0]), ("b", alone[1]))
        if not identical[name]
    }
    if differences:  # which step drifted first says whether a move or the maths did it
        report["first_difference"] = differences
    report["targets"] = _targets(args, report, rounds, memcpy)
    report["ok"] = all(report["targets"].values())
    return report


def _first_difference(swapped: list[str], alone: list[str]) -> dict[str, Any]:
    """The first step whose loss differs (as float.hex()), or the lengths when one is short."""
    for index, (got, want) in enumerate(zip(swapped, alone, strict=False)):
        if got != want:
            return {"step": index, "swapped": got, "alone": want}
    return {"swapped_steps": len(swapped), "alone_steps": len(alone)}


def _targets(
    args: argparse.Namespace, report: dict[str, Any], rounds: _Rounds, memcpy: dict[str, float]
) -> dict[str, bool]:
    """The issue's targets this run can judge (the report gains the side passes' parts)."""
    snap, rest = report["snapshot_d2h"], report["restore_h2d"]
    targets = {"bit_identical": all(report["bit_identical"].values())}
    if args.backend == "app":
        limit = {k: 1.25 * v + 0.05 for k, v in memcpy.items()}
        targets["app_within_1.25x_memcpy_plus_50ms"] = (
            snap["seconds_median"] <= limit["d2h"] and rest["seconds_median"] <= limit["h2d"]
        )
    if (cli := rounds.extra.get("cuda_checkpoint_cli")) is not None:
        ours = snap["seconds_median"] + rest["seconds_median"]
        theirs = cli["snapshot_seconds_median"] + cli["restore_seconds_median"]
        cli["speedup"] = theirs / ours if ours > 0 else None
        report["cuda_checkpoint_cli"] = cli
        targets["cuda_at_least_5x_faster_than_cli"] = bool(cli["speedup"] and cli["speedup"] >= 5)
    if (paths := rounds.extra.get("cuda_copy_paths")) is not None:
        report["cuda_copy_paths"] = paths
        if paths["custom_storage"]:
            ours = snap["seconds_median"] + rest["seconds_median"]
            theirs = (
                paths["pageable"]["snapshot_seconds_median"]
                + paths["pageable"]["restore_seconds_median"]
            )
            paths["speedup"] = theirs / ours if ours > 0 else None
            targets["cuda_custom_storage_at_least_5x_pageable"] = bool(
                paths["speedup"] and paths["speedup"] >= 5
            )
    if rounds.overlapped:
        overlapped = rounds.overlapped
        median = statistics.median(overlapped[1:] if len(overlapped) > 1 else overlapped)
        bound = 1.2 * max(memcpy["d2h"], memcpy["h2d"]) + 0.05
        report["overlapped_switch"] = {
            "seconds_median": median,
            "seconds_all": [round(x, 6) for x in overlapped],
            "serial_seconds": snap["seconds_median"] + rest["seconds_median"],
            "bound_seconds": bound,
        }
        targets["overlapped_within_1.2x_max_memcpy_plus_50ms"] = median <= bound
    return targets


def _text(report: dict[str, Any]) -> str:
    snap, rest, mem = report["snapshot_d2h"], report["restore_h2d"], report["pinned_memcpy"]
    gb = snap["bytes"] / 1e9
    lines = [
        f"backend {report['backend']}: {report['swaps']} swaps of {gb:.2f} GB per job",
        f"  snapshot d2h  {snap['seconds_median'] * 1e3:9.1f} ms  {snap['gb_per_s'] or 0:6.1f} GB/s"
        f"   memcpy {mem['d2h_seconds'] * 1e3:9.1f} ms  {mem['d2h_gb_per_s']:6.1f} GB/s",
        f"  restore  h2d  {rest['seconds_median'] * 1e3:9.1f} ms  {rest['gb_per_s'] or 0:6.1f} GB/s"
        f"   memcpy {mem['h2d_seconds'] * 1e3:9.1f} ms  {mem['h2d_gb_per_s']:6.1f} GB/s",
        f"  losses bit-identical to running alone: {report['bit_identical']}",
    ]
    if "overlapped_switch" in report:
        o = report["overlapped_switch"]
        lines.append(
            f"  overlapped switch {o['seconds_median'] * 1e3:9.1f} ms (serial "
            f"{o['serial_seconds'] * 1e3:.1f} ms, bound {o['bound_seconds'] * 1e3:.1f} ms)"
        )
    if "cuda_checkpoint_cli" in report:
        lines.append(
            f"  cuda-checkpoint CLI: {report['cuda_checkpoint_cli']['speedup']:.1f}x slower"
        )
    if (paths := report.get("cuda_copy_paths")) is not None:
        if paths["custom_storage"]:
            lines.append(f"  pageable path (copy=driver): {paths['speedup'] or 0:.1f}x slower")
        else:
            lines.append(f"  custom storage: not offered here ({paths['probe']})")
    lines += [
        f"  target {name}: {'met' if ok else 'MISSED'}" for name, ok in report["targets"].items()
    ]
    return "\n".join(lines)
