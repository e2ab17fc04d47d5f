"""`rlslice bench swap`: two torch jobs take turns on one GPU through a backend.

Two worker processes each hold `--gib` GiB on the GPU (a model, its Adam state, and a
ballast tensor the training reads and writes) and run a deterministic training loop (fixed
seeds, deterministic algorithms). The bench parks one, lets the other train `--steps`
steps, swaps them (snapshot the holder, restore the other) `--swaps` times, and reports:

- seconds and GB/s per direction (device→host = snapshot, host→device = restore), the
  first swaps (pinned-buffer warm-up) listed apart from the steady-state median;
- a pinned-memory memcpy of the same bytes, measured in the same run, and the target
  `swap ≤ 1.25 × memcpy + 50 ms` (app backend);
- whether each job's losses are bit-identical to the same job run alone;
- with `--compare-cli` (cuda backend), the same job moved by exec'ing `cuda-checkpoint`,
  and the target `cuda ≥ 5 × faster than the CLI`;
- with `--overlap`, as many switches again with the holder's snapshot and the other's
  restore at once (the agent's overlapped Switch when both fit: PCIe is full duplex), and
  the target `overlapped switch ≤ 1.2 × max(pinned D2H, pinned H2D) + 50 ms`.

The `cuda` backend is driven in-process (`CudaBackend`, as the agent would); `app` through
a `WorkloadLink` over each worker's pipe to its `TorchOffloader`. No agent is needed.
`python -m rlslice.apps.bench.swap --worker ...` is the worker.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Light (dataclasses only); the backends and torch are imported where used.
from rlslice.snapshot_agent.backends.base import OffloadAction, WorkloadAnswer

GiB = 1 << 30
_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "PYTHONSAFEPATH": "1"}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=["app", "cuda"], default="app")
    parser.add_argument("--gib", type=float, default=4.0, help="device state per job, GiB")
    parser.add_argument("--swaps", type=int, default=6, help="swaps (snapshot + restore)")
    parser.add_argument("--steps", type=int, default=10, help="training steps per turn")
    parser.add_argument("--device", type=int, default=0, help="CUDA device index")
    parser.add_argument("--timeout", type=float, default=300.0, help="deadline per move, s")
    parser.add_argument(
        "--compare-cli",
        action="store_true",
        help="also move the job with the cuda-checkpoint binary (cuda backend)",
    )
    parser.add_argument(
        "--overlap",
        action="store_true",
        help="also time switches whose snapshot and restore run at once",
    )
    parser.add_argument("--cpu", action="store_true", help=argparse.SUPPRESS)  # tests only


def _no_gpu(args: argparse.Namespace) -> str | None:
    if args.cpu:
        return None if args.backend == "app" else "--cpu works with --backend app only"
    try:
        import torch
    except ImportError:
        return "rlslice bench swap needs torch with CUDA: torch is not installed"
    if not torch.cuda.is_available():
        return (
            f"rlslice bench swap needs an NVIDIA GPU: torch {torch.__version__} sees none "
            f"(CUDA build: {torch.version.cuda or 'none'})"
        )
    return None


def run(args: argparse.Namespace) -> int:
    reason = _no_gpu(args)
    if reason is None and args.compare_cli and not shutil.which("cuda-checkpoint"):
        reason = "--compare-cli: no cuda-checkpoint binary on PATH"
    if reason is not None:
        print(json.dumps({"error": reason}) if args.json else f"error: {reason}", file=sys.stderr)
        return 2
    try:
        report = asyncio.run(_bench(args))
    except _BenchError as error:
        print(json.dumps({"error": str(error)}) if args.json else f"error: {error}")
        return 2
    print(json.dumps(report, indent=2) if args.json else _text(report))
    return 0 if report["ok"] else 1


class _BenchError(Exception):
    pass


# --- the worker side ----------------------------------------------------------------


class Worker:
    """A worker process: JSON lines on its stdin/stdout."""

    def __init__(self, proc: asyncio.subprocess.Process, hello: dict[str, Any]) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.hello = hello
        self._lock = asyncio.Lock()

    @classmethod
    async def start(cls, args: argparse.Namespace, seed: int) -> Worker:
        command = [sys.executable, "-m", "rlslice.apps.bench.swap", "--worker", "--seed", str(seed)]
        command += ["--gib", str(args.gib), "--device", str(args.device)]
        command += ["--cpu"] if args.cpu else []
        proc = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, **_ENV},
        )
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 300)
        if not line:
            raise _BenchError(f"worker {seed} exited during setup (status {await proc.wait()})")
        return cls(proc, json.loads(line))

    async def ask(self, timeout: float, **message: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        async with self._lock:
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            await self.proc.stdin.drain()
            line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not line:
            raise _BenchError(f"worker {self.pid} exited (status {await self.proc.wait()})")
        return dict(json.loads(line))

    async def train(self, steps: int) -> list[str]:
        return list((await self.ask(600, op="train", steps=steps))["losses"])

    async def quit(self) -> None:
        if self.proc.returncode is None:
            try:
                await self.ask(30, op="quit")
            except (_BenchError, TimeoutError, ConnectionError):
                pass
            await self.proc.wait()


class PipeLink:
    """A `WorkloadLink` to a worker's `TorchOffloader`, over its pipe (no agent needed)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.modes: frozenset[str] = frozenset(worker.hello["modes"])
        self.tags: tuple[str, ...] = tuple(worker.hello["tags"])
        self.local_server: tuple[str, int] | None = None

    async def command(
        self, action: OffloadAction, *, epoch: int, discard_tags: Sequence[str], timeout: float
    ) -> WorkloadAnswer:
        reply = await self.worker.ask(timeout, op=action.value, discard=list(discard_tags))
        return WorkloadAnswer(
            reply["ok"], reply.get("bytes", 0), reply.get("seconds", 0.0), reply.get("error", "")
        )


# --- the bench ----------------------------------------------------------------------


def _memcpy(nbytes: int, device: int, cpu: bool) -> dict[str, float]:
    """Seconds of a pinned host↔device copy of `nbytes` (median of 3, after a warm-up)."""
    import torch

    def sync() -> None:
        if not cpu:
            torch.cuda.synchronize(device)

    if cpu:
        dev = torch.empty(nbytes, dtype=torch.uint8)
        host = torch.empty(nbytes, dtype=torch.uint8)
    else:
        dev = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{device}")
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    timings: dict[str, list[float]] = {"d2h": [], "h2d": []}
    for _ in range(4):
        for name, dst, src in (("d2h", host, dev), ("h2d", dev, host)):
            sync()
            start = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            sync()
            timings[name].append(time.perf_counter() - start)
    del dev, host
    if not cpu:
        torch.cuda.empty_cache()
    return {name: statistics.median(values[1:]) for name, values in timings.items()}


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


async def _alone(args: argparse.Namespace, seed: int, turns: int) -> list[str]:
    worker = await Worker.start(args, seed)
    try:
        losses = []
        for _ in range(turns):
            losses += await worker.train(args.steps)
        return losses
    finally:
        await worker.quit()


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    from rlslice.snapshot_agent.backends.base import BackendContext, JobHandle

    modes = ["serial"] * args.swaps + (["overlapped"] * args.swaps if args.overlap else [])
    turns = len(modes) + 1
    turns_a, turns_b = (turns + 1) // 2, turns // 2
    # Reference: each job alone, same steps, no swaps (both at once: they do not interact).
    alone_a, alone_b = await asyncio.gather(_alone(args, 1, turns_a), _alone(args, 2, turns_b))

    state_dir = Path(tempfile.mkdtemp(prefix="rlslice-swap-"))
    context = BackendContext(node="bench", state_dir=state_dir)
    backend: Any
    if args.backend == "cuda":
        from rlslice.snapshot_agent.backends.cuda import CudaBackend

        backend = CudaBackend(context)
        probe = await backend.probe()
        if not probe.usable:
            raise _BenchError(f"cuda backend unusable here: {probe.detail}")
    else:
        from rlslice.snapshot_agent.backends.app import AppBackend

        backend = AppBackend(context)

    a, b = await asyncio.gather(Worker.start(args, 1), Worker.start(args, 2))
    jobs = {
        w.pid: JobHandle(job=f"swap-{name}", group="bench", pids=(w.pid,), workloads=(PipeLink(w),))
        for name, w in (("a", a), ("b", b))
    }
    losses: dict[int, list[str]] = {a.pid: [], b.pid: []}
    snapshots: list[tuple[int, float]] = []
    restores: list[tuple[int, float]] = []
    overlapped: list[float] = []
    cli: dict[str, Any] | None = None
    try:
        out = await backend.snapshot(jobs[b.pid], deadline=time.time() + args.timeout)
        snapshots.append((out.bytes, out.seconds))
        holder, parked = a, b
        for turn in range(turns):
            losses[holder.pid] += await holder.train(args.steps)
            if turn == turns - 1:
                break
            deadline = time.time() + args.timeout
            if modes[turn] == "overlapped":
                started = time.perf_counter()
                await asyncio.gather(
                    backend.snapshot(jobs[holder.pid], deadline=deadline),
                    backend.restore(jobs[parked.pid], deadline=deadline),
                )
                overlapped.append(time.perf_counter() - started)
            else:
                out = await backend.snapshot(jobs[holder.pid], deadline=deadline)
                snapshots.append((out.bytes, out.seconds))
                back = await backend.restore(jobs[parked.pid], deadline=deadline)
                restores.append((back.bytes, back.seconds))
            holder, parked = parked, holder
        if args.compare_cli:
            cli = await _compare_cli(args, context, jobs[holder.pid])
        await backend.restore(jobs[parked.pid], deadline=time.time() + args.timeout)
    finally:
        await asyncio.gather(a.quit(), b.quit())
        shutil.rmtree(state_dir, ignore_errors=True)

    snap = _summary(snapshots, warmup=2)  # the first offload of each worker pins its buffers
    rest = _summary(restores, warmup=0)
    memcpy = await asyncio.to_thread(_memcpy, max(snap["bytes"], 1), args.device, args.cpu)
    limit = {k: 1.25 * v + 0.05 for k, v in memcpy.items()}
    identical = {"a": losses[a.pid] == alone_a, "b": losses[b.pid] == alone_b}
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
        "losses_compared": {"a": len(alone_a), "b": len(alone_b)},
    }
    targets = {"bit_identical": all(identical.values())}
    if args.backend == "app":
        targets["app_within_1.25x_memcpy_plus_50ms"] = (
            snap["seconds_median"] <= limit["d2h"] and rest["seconds_median"] <= limit["h2d"]
        )
    if cli is not None:
        ours = snap["seconds_median"] + rest["seconds_median"]
        theirs = cli["snapshot_seconds_median"] + cli["restore_seconds_median"]
        cli["speedup"] = theirs / ours if ours > 0 else None
        report["cuda_checkpoint_cli"] = cli
        targets["cuda_at_least_5x_faster_than_cli"] = bool(cli["speedup"] and cli["speedup"] >= 5)
    if overlapped:
        median = statistics.median(overlapped[1:] if len(overlapped) > 1 else overlapped)
        bound = 1.2 * max(memcpy["d2h"], memcpy["h2d"]) + 0.05
        report["overlapped_switch"] = {
            "seconds_median": median,
            "seconds_all": [round(x, 6) for x in overlapped],
            "serial_seconds": snap["seconds_median"] + rest["seconds_median"],
            "bound_seconds": bound,
        }
        targets["overlapped_within_1.2x_max_memcpy_plus_50ms"] = median <= bound
    report["targets"] = targets
    report["ok"] = all(targets.values())
    return report


async def _compare_cli(args: argparse.Namespace, context: Any, job: Any) -> dict[str, Any]:
    """Move the same (resident) job twice with the cuda-checkpoint binary."""
    from rlslice.snapshot_agent.backends.cuda_checkpoint import CudaCheckpointBackend

    cli = CudaCheckpointBackend(context)
    snaps, rests = [], []
    for _ in range(2):
        out = await cli.snapshot(job, deadline=time.time() + args.timeout)
        snaps.append(out.seconds)
        back = await cli.restore(job, deadline=time.time() + args.timeout)
        rests.append(back.seconds)
    return {
        "snapshot_seconds_median": statistics.median(snaps),
        "restore_seconds_median": statistics.median(rests),
        "snapshot_seconds_all": snaps,
        "restore_seconds_all": rests,
    }


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
    lines += [
        f"  target {name}: {'met' if ok else 'MISSED'}" for name, ok in report["targets"].items()
    ]
    return "\n".join(lines)


# --- the worker process ---------------------------------------------------------------


def _worker(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--gib", type=float, required=True)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--cpu", action="store_true")
    args = parser.parse_args(argv)

    import torch

    from rlslice.client.offload import TorchOffloader

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
    step = 0
    batch = 256

    def send(message: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    send({"pid": os.getpid(), "modes": sorted(offloader.modes), "tags": list(offloader.tags)})
    for line in sys.stdin:
        request = json.loads(line)
        op = request["op"]
        if op == "quit":
            send({"ok": True})
            return
        if op == "train":
            losses = []
            for _ in range(request["steps"]):
                start = (step * 7919) % (rows - batch)
                x = ballast[start : start + batch]
                loss = torch.nn.functional.mse_loss(model(x), x.flip(1))
                optimizer.zero_grad(set_to_none=False)
                loss.backward()  # type: ignore[no-untyped-call]
                optimizer.step()
                with torch.no_grad():  # the ballast is state too: training writes it
                    ballast[start : start + batch].mul_(0.5).add_(model(x), alpha=0.5)
                losses.append(float(loss.item()).hex())
                step += 1
            send({"losses": losses})
            continue
        try:
            if op == "offload":
                result = offloader.offload(request.get("discard", []))
            elif op == "restore":
                result = offloader.restore()
            else:
                raise ValueError(f"unknown op {op!r}")
        except Exception as error:
            send({"ok": False, "error": f"{type(error).__name__}: {error}"})
            continue
        send({"ok": True, "bytes": result.bytes, "seconds": result.seconds})


if __name__ == "__main__":
    _worker(sys.argv[1:])
