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
- with the cuda backend, its two copy paths side by side when the driver offers custom
  storage (CUDA 13.4+): the swaps go through the agent's pinned ring, then the same job is
  moved through the driver's pageable staging (`copy=driver`), and the target
  `custom storage ≥ 5 × the pageable path`; where the driver lacks it (driver 580), the
  report says so and why (the probe's words) and has no such target;
- with `--overlap`, as many switches again with the holder's snapshot and the other's
  restore at once (the agent's overlapped Switch when both fit: PCIe is full duplex), and
  the target `overlapped switch ≤ 1.2 × max(pinned D2H, pinned H2D) + 50 ms`.

The `cuda` backend is driven in-process (`CudaBackend`, as the agent would); `app` through
a `WorkloadLink` over each worker's pipe to its `TorchOffloader`. No agent is needed.
`python -m rlslice.apps.bench.swap --worker ...` is the worker (`_swap_worker`); the report
and its targets are `_swap_report`.
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

from rlslice.apps.bench._swap_report import _report, _Rounds, _summary, _text

# Light (dataclasses only); the backends and torch are imported where used.
from rlslice.snapshot_agent.backends.base import OffloadAction, WorkloadAnswer

_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "PYTHONSAFEPATH": "1"}
_CPU_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
"""CPU workers (`--cpu`, the tests' plumbing run) compute on one thread: see `_swap_worker`."""


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


class SwapWorker:
    """A worker process: JSON lines on its stdin/stdout."""

    def __init__(self, proc: asyncio.subprocess.Process, hello: dict[str, Any]) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.hello = hello
        self._lock = asyncio.Lock()

    @classmethod
    async def start(cls, args: argparse.Namespace, seed: int) -> SwapWorker:
        command = [sys.executable, "-m", "rlslice.apps.bench.swap", "--worker", "--seed", str(seed)]
        command += ["--gib", str(args.gib), "--device", str(args.device)]
        command += ["--cpu"] if args.cpu else []
        proc = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, **_ENV, **(_CPU_ENV if args.cpu else {})},
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

    def __init__(self, worker: SwapWorker) -> None:
        self.worker = worker
        self.modes: frozenset[str] = frozenset(worker.hello["modes"])
        self.tags: tuple[str, ...] = tuple(worker.hello["tags"])
        self.local_server: tuple[str, int] | None = None
        self.pid = 0  # not an agent's stream: no peer credentials
        self.rank: int | None = None

    async def command(
        self,
        action: OffloadAction,
        *,
        epoch: int,
        discard_tags: Sequence[str],
        timeout: float,
        offload_tags: Sequence[str] | None = None,
    ) -> WorkloadAnswer:
        fields: dict[str, Any] = {"discard": list(discard_tags)}
        if offload_tags is not None:  # a partial offload; a whole one reads as before
            fields["offload_tags"] = list(offload_tags)
        reply = await self.worker.ask(timeout, op=action.value, **fields)
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


async def _alone(args: argparse.Namespace, seed: int, turns: int) -> list[str]:
    worker = await SwapWorker.start(args, seed)
    try:
        losses = []
        for _ in range(turns):
            losses += await worker.train(args.steps)
        return losses
    finally:
        await worker.quit()


def _store_dir() -> Path:
    """A private folder for the cuda backend's custom-storage copies: a tmpfs if there is one."""
    shm = Path("/dev/shm")
    return Path(tempfile.mkdtemp(prefix="rlslice-swap-store-", dir=shm if shm.is_dir() else None))


async def _make_backend(args: argparse.Namespace, state_dir: Path, **options: str) -> Any:
    from rlslice.snapshot_agent.backends.base import BackendContext

    context = BackendContext(node="bench", state_dir=state_dir, options=options)
    if args.backend == "app":
        from rlslice.snapshot_agent.backends.app import AppBackend

        return AppBackend(context)
    from rlslice.snapshot_agent.backends.cuda import CudaBackend

    backend = CudaBackend(context)
    probe = await backend.probe()
    if not probe.usable:
        raise _BenchError(f"cuda backend unusable here: {probe.detail}")
    backend.probe_detail = probe.detail  # type: ignore[attr-defined]
    return backend


async def _swap(
    backend: Any, out_job: Any, in_job: Any, mode: str, rounds: _Rounds, timeout: float
) -> None:
    """One switch: the holder out, the parked job in; serially or both at once."""
    deadline = time.time() + timeout
    if mode == "overlapped":
        started = time.perf_counter()
        await asyncio.gather(
            backend.snapshot(out_job, deadline=deadline),
            backend.restore(in_job, deadline=deadline),
        )
        rounds.overlapped.append(time.perf_counter() - started)
        return
    out = await backend.snapshot(out_job, deadline=deadline)
    rounds.snapshots.append((out.bytes, out.seconds))
    back = await backend.restore(in_job, deadline=deadline)
    rounds.restores.append((back.bytes, back.seconds))


async def _rounds(
    args: argparse.Namespace, backend: Any, state_dir: Path, modes: list[str]
) -> _Rounds:
    """Two workers take turns through `backend`; then the side passes on the resident job."""
    from rlslice.snapshot_agent.backends.base import JobHandle

    a, b = await asyncio.gather(SwapWorker.start(args, 1), SwapWorker.start(args, 2))
    jobs = {
        w.pid: JobHandle(job=f"swap-{name}", group="bench", pids=(w.pid,), workloads=(PipeLink(w),))
        for name, w in (("a", a), ("b", b))
    }
    rounds = _Rounds(losses={a.pid: [], b.pid: []})
    turns = len(modes) + 1
    try:
        out = await backend.snapshot(jobs[b.pid], deadline=time.time() + args.timeout)
        rounds.snapshots.append((out.bytes, out.seconds))
        holder, parked = a, b
        for turn in range(turns):
            rounds.losses[holder.pid] += await holder.train(args.steps)
            if turn < turns - 1:
                await _swap(
                    backend, jobs[holder.pid], jobs[parked.pid], modes[turn], rounds, args.timeout
                )
                holder, parked = parked, holder
        if args.compare_cli:
            rounds.extra["cuda_checkpoint_cli"] = await _compare_cli(
                args, state_dir, jobs[holder.pid]
            )
        if args.backend == "cuda":
            rounds.extra["cuda_copy_paths"] = await _copy_paths(
                args, backend, state_dir, jobs[holder.pid]
            )
        await backend.restore(jobs[parked.pid], deadline=time.time() + args.timeout)
        rounds.extra["workers"] = {"a": a.pid, "b": b.pid}
    finally:
        await asyncio.gather(a.quit(), b.quit())
    return rounds


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    modes = ["serial"] * args.swaps + (["overlapped"] * args.swaps if args.overlap else [])
    turns = len(modes) + 1
    # Reference: each job alone, same steps, no swaps (both at once: they do not interact).
    alone = await asyncio.gather(_alone(args, 1, (turns + 1) // 2), _alone(args, 2, turns // 2))
    state_dir = Path(tempfile.mkdtemp(prefix="rlslice-swap-"))
    store = _store_dir()
    try:
        options = {"store_dir": str(store)} if args.backend == "cuda" else {}
        backend = await _make_backend(args, state_dir, **options)
        rounds = await _rounds(args, backend, state_dir, modes)
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
        shutil.rmtree(store, ignore_errors=True)
    snap = _summary(rounds.snapshots, warmup=2)  # each worker's first offload pins buffers
    memcpy = await asyncio.to_thread(_memcpy, max(snap["bytes"], 1), args.device, args.cpu)
    return _report(args, rounds, (list(alone[0]), list(alone[1])), memcpy)


async def _copy_paths(
    args: argparse.Namespace, backend: Any, state_dir: Path, job: Any
) -> dict[str, Any]:
    """The cuda backend's copy paths side by side: the swaps above took the probe's path; with
    custom storage offered, the same (resident) job moves twice more through the driver's
    pageable staging (copy=driver)."""
    detail = str(getattr(backend, "probe_detail", ""))
    custom = "custom storage (" in detail and "pageable" not in detail
    found: dict[str, Any] = {"custom_storage": custom, "probe": detail}
    if not custom:
        found["why"] = "the driver lacks custom storage here: the swaps took the pageable path"
        return found
    store = str(state_dir / "pageable-store")  # unused by copy=driver; never a shared folder
    pageable = await _make_backend(args, state_dir / "pageable", copy="driver", store_dir=store)
    found["pageable"] = await _move_twice(args, pageable, job)
    return found


async def _move_twice(args: argparse.Namespace, backend: Any, job: Any) -> dict[str, Any]:
    snaps, rests = [], []
    for _ in range(2):
        out = await backend.snapshot(job, deadline=time.time() + args.timeout)
        snaps.append(out.seconds)
        back = await backend.restore(job, deadline=time.time() + args.timeout)
        rests.append(back.seconds)
    return {
        "snapshot_seconds_median": statistics.median(snaps),
        "restore_seconds_median": statistics.median(rests),
        "snapshot_seconds_all": snaps,
        "restore_seconds_all": rests,
    }


async def _compare_cli(args: argparse.Namespace, state_dir: Path, job: Any) -> dict[str, Any]:
    """Move the same (resident) job twice with the cuda-checkpoint binary."""
    from rlslice.snapshot_agent.backends.base import BackendContext
    from rlslice.snapshot_agent.backends.cuda_checkpoint import CudaCheckpointBackend

    cli = CudaCheckpointBackend(BackendContext(node="bench", state_dir=state_dir / "cli"))
    return await _move_twice(args, cli, job)


if __name__ == "__main__":
    from rlslice.apps.bench._swap_worker import main

    main(sys.argv[1:])
