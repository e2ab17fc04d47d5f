"""Two GRPO jobs, alone and then time-sliced on one group: are they bit-identical?

    python examples/grpo_tiny/compare.py                   # sync mode, CPU, `app` backend
    python examples/grpo_tiny/compare.py --mode async
    python examples/grpo_tiny/compare.py --device cuda --backend cuda   # on a GPU machine

1. Runs two jobs (different seeds) alone: no scheduler, every phase passes through.
2. Starts `rlslice up` (scheduler and agent in one process, loopback, its own temp dir)
   and puts one group whose headroom is larger than any device, so the two jobs can never
   both stay resident: every grant to the other job snapshots the holder.
3. Runs both jobs again at the same time on that group.
4. Compares each job's per-step losses and rewards and the SHA-256 of its final weights
   between the two runs (bit for bit), and reads the group's switch count from the
   scheduler and the bytes moved from the jobs' grants.

Prints a table; exits 0 only when everything is identical and switches moved bytes.
`--json FILE` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TRAIN = HERE / "train.py"
GROUP = "grpo-tiny"
#: Larger than any device: no two jobs fit side by side, so every switch moves state.
HEADROOM_BYTES = 1 << 50


@dataclass(frozen=True)
class Verdict:
    """One job's sliced run against its run alone."""

    job: str
    seed: int
    steps: int
    losses_identical: bool
    rewards_identical: bool
    weights_identical: bool
    restored_grants: int
    moved_bytes: int
    alone_seconds: float
    sliced_seconds: float
    reward_first: float
    reward_last: float

    @property
    def identical(self) -> bool:
        return self.losses_identical and self.rewards_identical and self.weights_identical


def judge(job: str, alone: Mapping[str, Any], sliced: Mapping[str, Any]) -> Verdict:
    """Compare two runs of one job (the JSON `train.py --out` writes)."""
    a, s = alone["steps"], sliced["steps"]
    tail = max(1, len(a) // 5)

    def mean_reward(rows: list[dict[str, Any]]) -> float:
        return sum(float.fromhex(r["reward"]) for r in rows) / len(rows)

    return Verdict(
        job=job,
        seed=int(alone["seed"]),
        steps=len(s),
        losses_identical=[r["loss"] for r in a] == [r["loss"] for r in s],
        rewards_identical=[r["reward"] for r in a] == [r["reward"] for r in s],
        weights_identical=alone["weights_sha256"] == sliced["weights_sha256"],
        restored_grants=sum(int(r["restored"]) for r in s),
        moved_bytes=sum(int(r["moved_bytes"]) for r in s),
        alone_seconds=float(alone["seconds"]),
        sliced_seconds=float(sliced["seconds"]),
        reward_first=mean_reward(a[:tail]),
        reward_last=mean_reward(a[-tail:]),
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _jobs(
    args: argparse.Namespace, work: Path, label: str, env: Mapping[str, str], alone: bool
) -> dict[str, dict[str, Any]]:
    """Run both jobs at once, their loops started together; their `--out` JSON by job."""
    barrier = work / f"barrier-{label}"
    barrier.mkdir()
    running = []
    for index, seed in enumerate(args.seeds):
        job = f"grpo-{'ab'[index]}"
        out = work / f"{job}-{label}.json"
        argv = [
            sys.executable, str(TRAIN), "--job", job, "--group", GROUP, "--seed", str(seed),
            "--mode", args.mode, "--steps", str(args.steps), "--device", args.device,
            "--backend", args.backend, "--out", str(out), "--quiet", "--barrier", str(barrier),
        ]  # fmt: skip
        if alone:
            argv.append("--alone")
        running.append((job, out, subprocess.Popen(argv, env=dict(env))))
    _release(barrier, [job for job, _, _ in running], [p for _, _, p in running], args.timeout)
    results = {}
    for job, out, process in running:
        if process.wait(timeout=args.timeout) != 0:
            raise RuntimeError(f"{job} ({label}) exited with {process.returncode}")
        results[job] = json.loads(out.read_text())
    return results


def _release(
    barrier: Path, jobs: list[str], processes: list[subprocess.Popen[bytes]], timeout: float
) -> None:
    """Once every job is ready, let them all go (see train.py's `wait_at_barrier`)."""
    deadline = time.monotonic() + timeout
    while not all((barrier / f"{job}.ready").exists() for job in jobs):
        for job, process in zip(jobs, processes, strict=True):
            if process.poll() is not None:
                raise RuntimeError(f"{job} exited with {process.returncode} before it was ready")
        if time.monotonic() > deadline:
            raise TimeoutError(f"jobs not ready within {timeout:g} s")
        time.sleep(0.01)
    (barrier / "go").touch()


@contextmanager
def rlslice_up(work: Path, backend: str, env: Mapping[str, str]) -> Iterator[tuple[str, str]]:
    """`rlslice up` on a free loopback port; yields (scheduler address, agent socket)."""
    address = f"127.0.0.1:{_free_port()}"
    argv = [
        sys.executable, "-m", "rlslice.apps", "--log-level", "WARNING", "up",
        "--address", address, "--store", str(work / "scheduler.sqlite"),
        "--socket", str(work / "agent.sock"), "--state-dir", str(work / "agent"),
        "--sim-root", str(work / "sim"), "--backend", backend, "--host-reserve-bytes", "0",
    ]  # fmt: skip
    log = (work / "up.log").open("wb")
    up = subprocess.Popen(argv, env=dict(env), stdout=subprocess.PIPE, stderr=log)
    try:
        assert up.stdout is not None
        # `rlslice up` prints its agent's line once scheduler and agent both serve.
        for raw in up.stdout:
            line = raw.decode().strip()
            if line.startswith("agent "):
                yield address, line.rsplit(" socket ", 1)[1]
                break
        else:
            raise RuntimeError(f"rlslice up exited: see {work / 'up.log'}")
    finally:
        up.terminate()
        try:
            up.wait(timeout=20)
        except subprocess.TimeoutExpired:
            up.kill()
        log.close()


def put_group(address: str, backend: str, timeout: float = 30.0) -> Any:
    """Create the group (backend, headroom) and wait until the agent takes part in it."""
    import grpc

    from rlslice.adapters.wire import group_spec_to_proto
    from rlslice.config import GroupSpec
    from rlslice.v1alpha1 import scheduler_pb2, scheduler_pb2_grpc

    spec = GroupSpec(name=GROUP, backend=backend, headroom_bytes=HEADROOM_BYTES, lease_seconds=60)
    with grpc.insecure_channel(address) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        stub.PutGroup(scheduler_pb2.PutGroupRequest(spec=group_spec_to_proto(spec)), timeout=10)
        deadline = time.monotonic() + timeout
        while True:  # the agent registers with the scheduler on its own schedule
            status = stub.GetGroup(scheduler_pb2.GetGroupRequest(group=GROUP), timeout=10)
            if status.nodes:
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(f"no agent joined group {GROUP} within {timeout:.0f} s")
            time.sleep(0.1)


def switches(address: str) -> int:
    """Switches the scheduler counted on the group."""
    import grpc

    from rlslice.v1alpha1 import scheduler_pb2, scheduler_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        return int(stub.GetGroup(scheduler_pb2.GetGroupRequest(group=GROUP), timeout=10).switches)


def table(verdicts: list[Verdict], group_switches: int) -> str:
    """The comparison as fixed-width text."""

    def same(flag: bool) -> str:
        return "identical" if flag else "DIFFERENT"

    head = (
        f"{'job':<7} {'seed':>4} {'steps':>5}  {'losses':<9}  {'rewards':<9}  {'weights':<9}"
        f"  {'restored':>8}  {'moved MB':>8}  {'alone s':>7}  {'sliced s':>8}  reward"
    )
    lines = [head, "-" * len(head)]
    for v in verdicts:
        lines.append(
            f"{v.job:<7} {v.seed:>4} {v.steps:>5}  {same(v.losses_identical):<9}  "
            f"{same(v.rewards_identical):<9}  {same(v.weights_identical):<9}  "
            f"{v.restored_grants:>8}  {v.moved_bytes / 1e6:>8.2f}  {v.alone_seconds:>7.1f}  "
            f"{v.sliced_seconds:>8.1f}  {v.reward_first:.3f} -> {v.reward_last:.3f}"
        )
    lines.append(f"group {GROUP}: {group_switches} switches")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", default="sync", choices=["sync", "async"])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seeds", type=int, nargs=2, default=[1, 2])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--backend", default="app", choices=["app", "cuda"])
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run of a job")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, JSON)")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="grpo-tiny-"))
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    for name in ("RLSLICE_SCHEDULER", "RLSLICE_AGENT_SOCKET", "RLSLICE_AGENT_REGISTERED"):
        env.pop(name, None)
    try:
        started = time.perf_counter()
        alone = _jobs(args, work, "alone", env, alone=True)
        with rlslice_up(work, args.backend, env) as (address, agent_socket):
            put_group(address, args.backend)
            sliced_env = {**env, "RLSLICE_SCHEDULER": address, "RLSLICE_AGENT_SOCKET": agent_socket}
            sliced = _jobs(args, work, "sliced", sliced_env, alone=False)
            group_switches = switches(address)
        verdicts = [judge(job, alone[job], sliced[job]) for job in sorted(alone)]
        moved = sum(v.moved_bytes for v in verdicts)
        ok = all(v.identical for v in verdicts) and group_switches > 0 and moved > 0
        print(f"mode {args.mode}, device {args.device}, backend {args.backend}")
        print(table(verdicts, group_switches))
        print(f"{'OK' if ok else 'FAILED'} in {time.perf_counter() - started:.1f} s")
        if args.json is not None:
            args.json.write_text(
                json.dumps(
                    {
                        "ok": ok,
                        "mode": args.mode,
                        "switches": group_switches,
                        "moved_bytes": moved,
                        "jobs": [asdict(v) for v in verdicts],
                    },
                    indent=2,
                )
            )
        return 0 if ok else 1
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
