"""`rlslice bench swap`'s worker process: one deterministic torch job behind a pipe.

`python -m rlslice.apps.bench.swap --worker --seed N --gib G` runs `main`: it builds a
model, its Adam state and a ballast tensor registered with a `TorchOffloader`, says hello
(pid, modes, tags) and answers JSON lines on stdin (`train`, `offload`, `restore`, `quit`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

GiB = 1 << 30


@dataclass
class _Job:
    """The worker's training state: a model, its Adam state, and a ballast it reads and writes."""

    model: Any
    optimizer: Any
    ballast: Any
    offloader: Any
    rows: int
    step: int = 0


def _build(args: argparse.Namespace) -> _Job:
    import torch

    from rlslice.client.offload import TorchOffloader

    if args.cpu:
        # One thread: a CPU op's reduction order follows the threads OpenMP actually gets,
        # and a loaded machine (CI) may give fewer than asked, which changes the bits.
        torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.manual_seed(args.seed)
    device = torch.device("cpu" if args.cpu else f"cuda:{args.device}")
    width = 64 if args.cpu else 2048
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.Linear(width, width)
    ).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    model_bytes = 4 * sum(p.numel() for p in model.parameters()) * 4  # params, grads, 2 moments
    rows = max(1024, (int(args.gib * GiB) - model_bytes) // (4 * width))
    generator = torch.Generator(device=device).manual_seed(args.seed)
    ballast = torch.randn(rows, width, device=device, generator=generator)
    offloader = TorchOffloader(device_type=device.type)
    offloader.register(model, "weights")
    offloader.register(optimizer, "optimizer")
    offloader.register(ballast, "state")
    return _Job(model, optimizer, ballast, offloader, rows)


def _train(job: _Job, steps: int, batch: int = 256) -> list[str]:
    """`steps` deterministic steps; each loss as float.hex() (bit-exact comparison)."""
    import torch

    losses = []
    for _ in range(steps):
        start = (job.step * 7919) % (job.rows - batch)
        x = job.ballast[start : start + batch]
        loss = torch.nn.functional.mse_loss(job.model(x), x.flip(1))
        job.optimizer.zero_grad(set_to_none=False)
        loss.backward()  # type: ignore[no-untyped-call]
        job.optimizer.step()
        with torch.no_grad():  # the ballast is state too: training writes it
            job.ballast[start : start + batch].mul_(0.5).add_(job.model(x), alpha=0.5)
        losses.append(float(loss.item()).hex())
        job.step += 1
    return losses


def _move(job: _Job, request: dict[str, Any]) -> dict[str, Any]:
    """An offload or restore command's answer."""
    op = request["op"]
    try:
        if op == "offload":
            result = job.offloader.offload(request.get("discard", []))
        elif op == "restore":
            result = job.offloader.restore()
        else:
            raise ValueError(f"unknown op {op!r}")
    except Exception as error:
        return {"ok": False, "error": f"{type(error).__name__}: {error}"}
    return {"ok": True, "bytes": result.bytes, "seconds": result.seconds}


def main(argv: Sequence[str]) -> None:
    """The worker's loop: build the job, say hello, answer requests until `quit`."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--gib", type=float, required=True)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--cpu", action="store_true")
    job = _build(parser.parse_args(argv))

    def send(message: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    offloader = job.offloader
    send({"pid": os.getpid(), "modes": sorted(offloader.modes), "tags": list(offloader.tags)})
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "quit":
            send({"ok": True})
            return
        if request["op"] == "train":
            send({"losses": _train(job, request["steps"])})
        else:
            send(_move(job, request))
