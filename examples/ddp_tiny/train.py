"""One rank of a tiny data-parallel job that takes turns on the GPUs through rlslice.

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 \\
        python examples/ddp_tiny/train.py --job ddp-a --alone &
    RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 \\
        python examples/ddp_tiny/train.py --job ddp-a --alone

Each rank is one process, started as torchrun starts them (the `RANK`, `WORLD_SIZE`,
`LOCAL_RANK`, `MASTER_ADDR` and `MASTER_PORT` variables; `compare.py` does it). The ranks
join one torch.distributed group (gloo on CPU, NCCL with `--device cuda`), build the same
small regression MLP from the job's seed, and train it data-parallel: each step every rank
makes its own shard of the batch on the CPU (outside every phase: another job may hold the
GPUs then), computes gradients on it, and the gradients are averaged with `all_reduce`.

rlslice adds three things, all in `main()`:
1. `RankedClient`: rank 0 asks the scheduler for the job; every rank enters and leaves
   each phase together (a barrier at the end of a phase: no collective in flight when the
   job is parked).
2. For the `app` backend, each rank's own offload loop (`TorchOffloader` over its model
   and optimizer), which registers the rank's process with its node's agent under the job.
3. `client.phase("train")` around the GPU work.

`--out FILE` writes this rank's per-step losses (float hex), its final weights' SHA-256,
and what its offloader moved (bytes and seconds per switch).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Deterministic cuBLAS needs this before CUDA starts (harmless on CPU).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch
import torch.distributed as dist

from rlslice.client import RankedClient
from rlslice.client.offload import OffloadResult, OffloadThread

WIDTH = 64
FEATURES = 16
BATCH = 32


def model_for(seed: int, device: torch.device) -> torch.nn.Module:
    """The job's model: the same initial weights on every rank (seeded)."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, WIDTH),
        torch.nn.Tanh(),
        torch.nn.Linear(WIDTH, WIDTH),
        torch.nn.Tanh(),
        torch.nn.Linear(WIDTH, 1),
    ).to(device)


def shard(seed: int, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's batch of a step, made on the CPU: y = sum(sin(x)) plus seeded noise."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    x = torch.randn(BATCH, FEATURES, generator=generator)
    y = torch.sin(x).sum(dim=1, keepdim=True) + 0.1 * torch.randn(BATCH, 1, generator=generator)
    return x, y


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: tuple[torch.Tensor, torch.Tensor],
    device: torch.device,
) -> float:
    """One data-parallel step: local gradients, averaged over the ranks, one Adam step.
    Returns the job's mean loss of the step (the same on every rank)."""
    x, y = (t.to(device) for t in batch)
    optimizer.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    world = dist.get_world_size()
    for parameter in model.parameters():
        assert parameter.grad is not None
        dist.all_reduce(parameter.grad, op=dist.ReduceOp.SUM)
        parameter.grad.div_(world)
    optimizer.step()
    mean = loss.detach().clone()
    dist.all_reduce(mean, op=dist.ReduceOp.SUM)
    return float(mean.item() / world)


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 of the weights' bytes, in parameter order."""
    digest = hashlib.sha256()
    for parameter in model.parameters():
        digest.update(parameter.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


class Counted:
    """An offloader that counts what the one it wraps moved for this rank, per command."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.moves: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    @property
    def modes(self) -> frozenset[str]:
        return frozenset(self.inner.modes)

    @property
    def tags(self) -> tuple[str, ...]:
        return tuple(self.inner.tags)

    def _note(self, kind: str, result: OffloadResult) -> OffloadResult:
        with self._lock:
            self.moves.append({"move": kind, "bytes": result.bytes, "seconds": result.seconds})
        return result

    def offload(self, discard_tags: Sequence[str] = ()) -> OffloadResult:
        return self._note("offload", self.inner.offload(discard_tags))

    def restore(self) -> OffloadResult:
        return self._note("restore", self.inner.restore())

    @property
    def pinned_bytes(self) -> int:
        return int(getattr(self.inner, "pinned_bytes", 0))


def start_offload(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, args: argparse.Namespace
) -> tuple[OffloadThread, Counted]:
    """This rank's half of the `app` backend: its own tensors to host memory and back on
    the agent's command. The loop registers this process with the node's agent (so the
    client must not: the socket is taken out of the environment)."""
    from rlslice.client import CommunicatorOffloader
    from rlslice.client.offload import AGENT_SOCKET_ENV, TorchOffloader, start_offload_thread

    tensors = TorchOffloader(device_type=args.device)
    tensors.register(model, "weights")
    tensors.register(optimizer, "optimizer")
    counted = Counted(tensors)
    # The communicators follow the tensors: NCCL >= 2.29.7 suspends them; gloo has none.
    parts: list[Any] = [counted, CommunicatorOffloader()]
    socket_path = os.environ.pop(AGENT_SOCKET_ENV, None)
    offload = start_offload_thread(parts, job=args.job, group=args.group, socket_path=socket_path)
    offload.wait_connected()
    return offload, counted


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", default="ddp-a")
    parser.add_argument("--group", default="ddp-tiny")
    parser.add_argument("--scheduler", default=os.environ.get("RLSLICE_SCHEDULER"))
    parser.add_argument("--alone", action="store_true", help="no scheduler: phases pass through")
    parser.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--out", type=Path, help="write this rank's figures here (JSON)")
    parser.add_argument(
        "--barrier",
        type=Path,
        help="folder: once every rank is ready, rank 0 writes JOB.ready there and waits for "
        "a file named go (compare.py starts both jobs' loops together this way)",
    )
    parser.add_argument(
        "--quiesce-seconds",
        type=float,
        default=60.0,
        help="how long a rank waits for the others at a phase's end before the job fails",
    )
    parser.add_argument("--quiet", action="store_true", help="no per-step lines")
    return parser.parse_args(argv)


def wait_at_barrier(folder: Path, job: str, timeout: float = 120.0) -> None:
    """Say the job is ready, then wait until the runner says go."""
    (folder / f"{job}.ready").touch()
    deadline = time.monotonic() + timeout
    while not (folder / "go").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{job}: no go in {folder} within {timeout:g} s")
        time.sleep(0.01)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        device = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank = dist.get_rank()
    model = model_for(args.seed, device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    scheduler = None if args.alone else args.scheduler
    if args.alone:
        os.environ.pop("RLSLICE_SCHEDULER", None)
    offload, counted = start_offload(model, optimizer, args) if scheduler else (None, None)
    # Every rank together: the ranks' coordination group is created here.
    client = RankedClient(
        job=args.job,
        group=args.group,
        scheduler=scheduler,
        register_with_agent=offload is None,
        quiesce_seconds=args.quiesce_seconds,
        lease_seconds=60.0,
    )
    dist.barrier()  # every rank's offload stream is open before the first phase
    if args.barrier is not None:
        if rank == 0:
            wait_at_barrier(args.barrier, args.job)
        dist.barrier()
    losses: list[str] = []
    grants: list[dict[str, Any]] = []
    started = time.perf_counter()
    try:
        for step in range(args.steps):
            batch = shard(args.seed, step, rank)  # CPU: another job may hold the GPUs now
            with client.phase("train") as grant:
                loss = train_step(model, optimizer, batch, device)
            losses.append(loss.hex())
            if grant is not None:
                grants.append(
                    {
                        "restored": grant.restored,
                        "moved_bytes": grant.moved_bytes,
                        "switch_seconds": grant.switch_seconds,
                    }
                )
            if not args.quiet and rank == 0:
                print(f"{args.job} step {step:3d} loss {loss:.5f}", flush=True)
        with client.phase("checkpoint"):  # the weights are on the device only inside a phase
            digest = weights_digest(model)
    finally:
        client.close()
        if offload is not None:
            offload.stop()
    seconds = time.perf_counter() - started
    dist.barrier()
    dist.destroy_process_group()
    if args.out is not None:
        result = {
            "job": args.job,
            "rank": rank,
            "world_size": int(os.environ.get("WORLD_SIZE", "1")),
            "seed": args.seed,
            "seconds": seconds,
            "losses": losses,
            "weights_sha256": digest,
            "grants": grants,
            "moves": counted.moves if counted is not None else [],
        }
        args.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
