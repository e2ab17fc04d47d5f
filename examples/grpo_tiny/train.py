"""A tiny GRPO job that takes turns on the GPUs through rlslice.

    python examples/grpo_tiny/train.py --alone                 # no scheduler
    python examples/grpo_tiny/train.py --mode async --alone    # bounded staleness
    python examples/grpo_tiny/train.py --job grpo-a --seed 1   # with `rlslice up` running

The policy (a tiny transformer) learns addition from a verifier's reward.
rlslice adds two things to the loop: `client.phase(...)` around the GPU work, and, for the
`app` backend, a `TorchOffloader` that moves the registered tensors out when another job
takes the GPU and back before this job's next phase. The verifier runs on the CPU,
outside every phase: that is when the other job gets the group.

`--mode sync`: rollout with policy v, verify, train -> v+1. Strict barrier, on-policy.
`--mode async`: the rollout of step k+1 (sampler weights v_k) runs while batch k trains;
the trainer accepts records at most `--max-staleness` versions old and takes the clipped
ratio against their behaviour log-probabilities.

Both are deterministic for a seed: the data each step uses is fixed by the loop's
structure, never by thread timing. `--out FILE` writes per-step figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

# Deterministic cuBLAS needs this before CUDA starts (harmless on CPU).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
# The example's own modules sit beside this file (PYTHONSAFEPATH=1 leaves this folder off).
sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpo
import task
import torch
from learner import Learner, Settings, TrainStats

from rlslice.client import Client, Grant
from rlslice.client.offload import OffloadThread


def score(samples: list[grpo.Sample]) -> list[dict[str, Any]]:
    """The verifier, on the CPU: each sample becomes a rollout record with its reward."""
    return [
        s.scored(
            task.verify(task.Problem.from_prompt(s.prompt_tokens), s.response_tokens),
            task.VERIFIER_VERSION,
        )
        for s in samples
    ]


def verified(samples: list[grpo.Sample]) -> list[dict[str, Any]]:
    """Score, then check every record against the rollout contract before it is trained on."""
    records = score(samples)
    grpo.check_records(records)
    return records


#: Called after every train step with its figures and the grants of the step's phases.
OnStep = Callable[[TrainStats, list[Grant]], None]


def run_sync(learner: Learner, client: Client, steps: int, on_step: OnStep) -> None:
    """Synchronous GRPO: a strict barrier between sampling and training."""
    for step in range(steps):
        with client.phase("rollout") as sampling:  # GPU: sample with policy v
            samples = learner.rollout(step)
        records = verified(samples)  # CPU: another job may hold the GPU now
        with client.phase("train") as training:  # GPU: v -> v+1
            stats = learner.train(records, max_staleness=0)
        on_step(stats, [sampling, training])


def run_async(
    learner: Learner,
    client: Client,
    steps: int,
    max_staleness: int,
    on_step: OnStep,
) -> None:
    """Asynchronous GRPO with bounded staleness: sampling for step k+1 overlaps training k.

    The sampler samples from its own copy of the weights, refreshed after each train step,
    so batch k+1 always comes from v_k whatever the threads' timing: one version stale.
    Both halves run inside one phase, since both use the GPU.
    """
    with client.phase("rollout") as first:  # GPU: the first batch, from v0
        samples = learner.rollout(0)
    records = verified(samples)  # CPU
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="sampler") as sampler:
        for step in range(steps):
            with client.phase("rollout+train") as grant:  # GPU: sampler and trainer overlap
                upcoming = sampler.submit(learner.rollout, step + 1) if step + 1 < steps else None
                stats = learner.train(records, max_staleness)  # v_k -> v_k+1
                samples = upcoming.result() if upcoming is not None else []  # from v_k
                learner.sync_sampler()  # weight sync: the sampler moves to v_k+1
            on_step(stats, [first, grant] if step == 0 else [grant])
            if samples:
                records = verified(samples)  # CPU: another job may hold the GPU now


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", default="grpo-a")
    parser.add_argument("--group", default="grpo-tiny")
    parser.add_argument(
        "--scheduler", default=os.environ.get("RLSLICE_SCHEDULER", "127.0.0.1:50551")
    )
    parser.add_argument("--alone", action="store_true", help="no scheduler: phases pass through")
    parser.add_argument(
        "--backend",
        default="app",
        choices=["app", "cuda"],
        help="app: this process offloads its own tensors; cuda: the agent checkpoints it",
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--mode", default="sync", choices=["sync", "async"])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--digits", type=int, default=1, help="digits of each operand")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=16, help="samples per prompt")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--entropy-coef", type=float, default=0.05)
    parser.add_argument("--max-staleness", type=int, default=1, help="async mode only")
    parser.add_argument("--out", type=Path, help="write per-step figures here (JSON)")
    parser.add_argument(
        "--barrier",
        type=Path,
        help="folder: once ready, write JOB.ready there and wait for a file named go "
        "(compare.py starts both jobs' loops together this way)",
    )
    parser.add_argument("--quiet", action="store_true", help="no per-step lines")
    return parser.parse_args(argv)


def start_offload(learner: Learner, job: str, group: str) -> OffloadThread:
    """The `app` backend's half in the job: on the agent's command, this process moves its
    own registered tensors to host memory and back.

    The offload thread registers the process with the agent itself, so the agent socket is
    taken out of the environment: the client must not register the process a second time.
    """
    from rlslice.client.offload import AGENT_SOCKET_ENV, TorchOffloader, start_offload_thread

    offloader = TorchOffloader(device_type=learner.device.type)
    offloader.register(learner.policy, "weights")  # parameters and gradients
    offloader.register(learner.optimizer, "optimizer")  # Adam's moments, once they exist
    if learner.sampler is not learner.policy:
        offloader.register(learner.sampler, "sampler")  # async mode's copy of the weights
    socket_path = os.environ.pop(AGENT_SOCKET_ENV, None)
    offload = start_offload_thread(offloader, job=job, group=group, socket_path=socket_path)
    offload.wait_connected()  # registered and streaming before the first switch
    return offload


def wait_at_barrier(folder: Path, job: str, timeout: float = 120.0) -> None:
    """Say this job is ready (imports done, model built, offload stream open), then wait
    until the runner says go: jobs that start their loops together really take turns,
    however long each took to start (torch's import alone takes seconds on a busy machine)."""
    (folder / f"{job}.ready").touch()
    deadline = time.monotonic() + timeout
    while not (folder / "go").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{job}: no go in {folder} within {timeout:g} s")
        time.sleep(0.01)


class History:
    """Per-step figures; losses and rewards as float hex, so runs compare bit for bit."""

    def __init__(self, job: str, quiet: bool) -> None:
        self.job = job
        self.quiet = quiet
        self.steps: list[dict[str, Any]] = []

    def __call__(self, stats: TrainStats, grants: list[Grant]) -> None:
        moved = sum(g.moved_bytes for g in grants)
        self.steps.append(
            {
                "version": stats.version,
                "loss": stats.loss.hex(),
                "reward": stats.reward.hex(),
                "exact": stats.exact,
                "staleness": stats.staleness,
                "clipped": stats.clipped,
                "restored": sum(g.restored for g in grants),
                "moved_bytes": moved,
                "switch_seconds": sum(g.switch_seconds for g in grants),
            }
        )
        if not self.quiet:
            print(
                f"{self.job} v{stats.version:<3d} reward {stats.reward:.3f}  "
                f"exact {stats.exact:.3f}  loss {stats.loss:+.4f}  staleness {stats.staleness}"
                + (f"  moved {moved / 1e6:.2f} MB" if moved else ""),
                flush=True,
            )

    def trend(self, key: str) -> tuple[float, float]:
        """Mean of `key` over the first and the last fifth of the steps."""
        tail = max(1, len(self.steps) // 5)

        def mean(rows: list[dict[str, Any]]) -> float:
            values = [float.fromhex(r[key]) if isinstance(r[key], str) else r[key] for r in rows]
            return sum(values) / len(values)

        return mean(self.steps[:tail]), mean(self.steps[-tail:])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Determinism: one intra-op thread and deterministic kernels, on CPU and CUDA.
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    settings = Settings(
        seed=args.seed,
        digits=args.digits,
        prompts=args.prompts,
        group_size=args.group_size,
        lr=args.lr,
        entropy_coef=args.entropy_coef,
        separate_sampler=args.mode == "async",
    )
    learner = Learner(settings, torch.device(args.device), args.job)
    if args.alone:
        os.environ.pop("RLSLICE_SCHEDULER", None)  # the client would read it otherwise
    scheduler = None if args.alone else args.scheduler
    offload = (
        start_offload(learner, args.job, args.group)
        if scheduler and args.backend == "app"
        else None
    )
    client = Client(
        job=args.job,
        group=args.group,
        scheduler=scheduler,
        lease_seconds=60.0,
        device_bytes=learner.device_bytes,
    )
    history = History(args.job, args.quiet)
    if args.barrier is not None:
        wait_at_barrier(args.barrier, args.job)
    started = time.perf_counter()
    try:
        if args.mode == "sync":
            run_sync(learner, client, args.steps, history)
        else:
            run_async(learner, client, args.steps, args.max_staleness, history)
        with client.phase("checkpoint"):  # the weights are on the device only inside a phase
            digest = learner.weights_digest()
    finally:
        client.close()
        if offload is not None:
            offload.stop()
    seconds = time.perf_counter() - started
    (reward0, reward1), (exact0, exact1) = history.trend("reward"), history.trend("exact")
    print(
        f"{args.job} ({args.mode}, seed {args.seed}): {len(history.steps)} steps in "
        f"{seconds:.1f} s; reward {reward0:.3f} -> {reward1:.3f}, "
        f"exact {exact0:.3f} -> {exact1:.3f}; weights {digest[:16]}",
        flush=True,
    )
    if args.out is not None:
        result = {"job": args.job, "mode": args.mode, "seed": args.seed, "seconds": seconds}
        result |= {"steps": history.steps, "weights_sha256": digest}
        args.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
