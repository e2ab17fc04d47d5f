"""Reproduce the course notebook's tables and figures (seed 001) without Jupyter.

    python examples/module12/reproduce.py --out module12-out --duration 120

Writes CSV tables and PNG figures to --out and prints the tables. Needs the planner
extra (matplotlib); pandas and IPython are not needed.
"""

from __future__ import annotations

import argparse
import csv
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlslice.planner import (
    BYTES_PER_GIB,
    PipelineConfig,
    PipelineResult,
    article_scenario,
    checkpoint_as_dict,
    checkpoint_cadence,
    human_bytes,
    kv_cache_bytes,
    make_checkpoint,
    model_state_bytes,
    optimal_checkpoint_interval,
    peak_memory,
    pipeline_report,
    plot_timeline,
    recovery_drill,
    result_row,
    simulate_pipeline,
    straggler_report,
    synchronization_schedule,
    synchronization_transfer_time,
)

SEED = 12016


def write_table(out: Path, name: str, rows: Sequence[Mapping[str, object]]) -> Path:
    """Write `rows` to `out/name.csv` and print them as aligned text."""
    path = out / f"{name}.csv"
    columns = list(rows[0])
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    widths = {c: max(len(c), *(len(_fmt(r[c])) for r in rows)) for c in columns}
    print(f"\n== {name} ==")
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(_fmt(row[c]).ljust(widths[c]) for c in columns))
    return path


def _fmt(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def memory_tables(out: Path) -> None:
    memory_profiles(out)
    phase_memory(out)
    pipeline_table(out)


def memory_profiles(out: Path) -> None:
    profiles = {
        "7B / 12-byte full-training profile": model_state_bytes(
            7_000_000_000,
            parameter_bytes=2,
            gradient_bytes=2,
            optimizer_state_bytes=8,
            master_parameter_bytes=0,
        ),
        "7B / 16-byte full-training profile": model_state_bytes(
            7_000_000_000,
            parameter_bytes=2,
            gradient_bytes=2,
            optimizer_state_bytes=8,
            master_parameter_bytes=4,
        ),
        "7B base + 1% trainable adapters": model_state_bytes(
            7_070_000_000,
            trainable_parameters=70_000_000,
            parameter_bytes=2,
            gradient_bytes=2,
            optimizer_state_bytes=8,
            master_parameter_bytes=4,
        ),
    }
    write_table(
        out,
        "memory_profiles",
        [
            {
                "profile": name,
                "logical bytes": p.total_bytes,
                "GiB": p.total_bytes / BYTES_PER_GIB,
                "human": human_bytes(p.total_bytes),
            }
            for name, p in profiles.items()
        ],
    )


def phase_memory(out: Path) -> None:
    kv = kv_cache_bytes(64, 4096, 32, 4, 128, 2)
    phases = peak_memory(
        {
            "rollout": [14 * BYTES_PER_GIB, kv, 2 * BYTES_PER_GIB],
            "training": [14 * BYTES_PER_GIB, 8 * BYTES_PER_GIB, 28 * BYTES_PER_GIB],
            "weight publication": [14 * BYTES_PER_GIB, 14 * BYTES_PER_GIB, 2 * BYTES_PER_GIB],
        }
    )
    print(
        f"\nKV cache: {human_bytes(kv)}; peak phase: {phases.phase} {human_bytes(phases.peak_bytes)}"
    )
    write_table(
        out,
        "phase_memory",
        [
            {"phase": name, "GiB": value / BYTES_PER_GIB}
            for name, value in phases.phase_totals.items()
        ],
    )


def pipeline_table(out: Path) -> None:
    pipe = pipeline_report(rollout_seconds=60.0, train_seconds=20.0, batches=10)
    stragglers = straggler_report([3, 3, 4, 4, 5, 5, 6, 18])
    write_table(
        out,
        "pipeline",
        [
            {
                "sequential s": pipe.sequential_total,
                "pipelined s": pipe.pipeline_total,
                "speedup": pipe.speedup,
                "straggler utilization": stragglers.utilization,
            },
        ],
    )


def pipeline_figures(out: Path, duration: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = {name: simulate_pipeline(cfg) for name, cfg in pipeline_configs(duration).items()}
    pipeline_tables(out, results)
    queue_figure(out, results, plt)
    lag_figure(out, results, plt)


def pipeline_configs(duration: float) -> dict[str, PipelineConfig]:
    def bounded_async(max_policy_lag: int, sync_every_updates: int) -> PipelineConfig:
        return PipelineConfig(
            mode="bounded_async",
            duration_seconds=duration,
            max_queue_tokens=7000,
            max_policy_lag=max_policy_lag,
            sync_every_updates=sync_every_updates,
            seed=SEED,
        )

    return {
        "sequential": PipelineConfig(mode="sequential", duration_seconds=duration, seed=SEED),
        "bounded async / sync every update": bounded_async(2, 1),
        "deeper async / sync every 3 updates": bounded_async(6, 3),
    }


def pipeline_tables(out: Path, results: Mapping[str, PipelineResult]) -> None:
    write_table(
        out, "pipeline_profiles", [{"profile": n, **result_row(r)} for n, r in results.items()]
    )
    write_table(
        out,
        "queue",
        [
            {
                "profile": n,
                "maximum observed queue, tokens": r.max_queue_tokens_observed,
                "backpressure, s": r.backpressure_seconds,
                "discarded rollouts": r.discarded_rollouts,
            }
            for n, r in results.items()
        ],
    )
    lag_rows = []
    for name, result in results.items():
        lags = [b.mean_lag for b in result.batches] or [0.0]
        ess = [b.normalized_ess for b in result.batches] or [1.0]
        lag_rows.append(
            {
                "profile": name,
                "updates": len(result.batches),
                "mean_lag": statistics.fmean(lags),
                "mean_nESS": statistics.fmean(ess),
                "min_nESS": min(ess),
            }
        )
    write_table(out, "lag_and_ess", lag_rows)


def queue_figure(out: Path, results: Mapping[str, PipelineResult], plt: Any) -> None:
    fig, ax = plt.subplots(figsize=(9.5, 4.8))
    for name, result in results.items():
        if result.config.mode == "bounded_async":
            ax.plot(
                [r["time"] for r in result.timeline],
                [r["queue_tokens"] for r in result.timeline],
                label=name,
            )
    ax.axhline(7000, linestyle="--", linewidth=1.5, label="new-rollout admission threshold")
    ax.set(
        xlabel="time, s",
        ylabel="tokens in queue",
        title="A bounded queue converts overload into observable backpressure",
    )
    ax.grid(alpha=0.25)
    ax.legend()
    fig.savefig(out / "queue_tokens.png", dpi=110)
    plt.close(fig)


def lag_figure(out: Path, results: Mapping[str, PipelineResult], plt: Any) -> None:
    fig, ax = plt.subplots(figsize=(8.6, 4.6))
    for name, result in results.items():
        if name != "sequential":
            ax.scatter(
                [b.mean_lag for b in result.batches],
                [b.normalized_ess for b in result.batches],
                s=20,
                alpha=0.65,
                label=name,
            )
    ax.set(
        xlabel="mean policy lag in a batch, versions",
        ylabel="normalized ESS",
        ylim=(0, 1.03),
        title="The simulator exposes a speed–freshness trade-off, not a theorem",
    )
    ax.grid(alpha=0.25)
    ax.legend()
    fig.savefig(out / "lag_vs_ess.png", dpi=110)
    plt.close(fig)


def sync_and_recovery(out: Path) -> None:
    write_table(
        out,
        "sync_transfer",
        [
            {
                "payload": name,
                "GiB": payload / BYTES_PER_GIB,
                "transfer over 25 GB/s at 80% efficiency, s": synchronization_transfer_time(
                    payload, 25.0, setup_seconds=0.15, efficiency=0.80
                ),
            }
            for name, payload in (
                ("full 7B bf16 weights", 14_000_000_000),
                ("1% bf16 adapter", 140_000_000),
            )
        ],
    )
    write_table(
        out,
        "sync_cadence",
        [
            {
                "sync every K updates": k,
                "synchronizations": s.synchronization_count,
                "mean lag": s.mean_lag,
                "max lag": s.max_lag,
            }
            for k in (1, 2, 4, 8)
            for s in [synchronization_schedule(sync_every=k, updates=16)]
        ],
    )
    interval = optimal_checkpoint_interval(180.0, 36_000.0)
    cadence = checkpoint_cadence(interval, checkpoint_seconds=180.0, mtbf_seconds=36_000.0)
    print(f"\nYoung interval: {interval:.0f} s; overhead {cadence.total_overhead_fraction:.1%}")
    import numpy as np

    rng = np.random.default_rng(SEED)
    rng.integers(0, 10_000, size=8)
    manifest = make_checkpoint(
        optimizer_step=3, current_version=3, published_version=3, dataset_cursor=8, rng=rng
    )
    row = {k: v for k, v in checkpoint_as_dict(manifest).items() if k != "rng_state"}
    write_table(out, "checkpoint_manifest", [row])
    drill = recovery_drill(seed=SEED, before=8, after=8)
    write_table(
        out,
        "recovery_drill",
        [
            {"run": "uninterrupted", **vars(drill.uninterrupted)},
            {"run": "correct resume", **vars(drill.resumed)},
            {"run": "weights-only resume", **vars(drill.broken_resume)},
        ],
    )
    if not drill.exact_match or drill.broken_match:
        raise SystemExit("recovery drill: the complete checkpoint did not resume exactly")


def interleaving_figure(out: Path) -> None:
    result = article_scenario().run()
    print(
        f"\nArticle scenario: busy {result.dedicated_busy_fraction:.0%} dedicated -> "
        f"{result.sliced_busy_fraction:.0%} time-sliced, {result.switches} switches"
    )
    plot_timeline(
        result.intervals,
        out / "article_timeline.png",
        switches=result.switch_markers,
        title="Two synchronous GRPO jobs time-sliced on one group",
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("module12-out"), help="output folder")
    parser.add_argument("--duration", type=float, default=120.0, help="simulated seconds")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    memory_tables(args.out)
    pipeline_figures(args.out, args.duration)
    sync_and_recovery(args.out)
    interleaving_figure(args.out)
    print(f"\nwrote {len(list(args.out.iterdir()))} files to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
