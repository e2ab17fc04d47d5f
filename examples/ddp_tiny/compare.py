"""Two data-parallel jobs of many ranks, alone and then time-sliced: bit-identical?

    python examples/ddp_tiny/compare.py                 # one node, 2 ranks per job
    python examples/ddp_tiny/compare.py --nodes 2       # two agents on loopback, 4 ranks per job
    python examples/ddp_tiny/compare.py --device cuda   # NCCL, on a GPU machine

1. Runs two jobs (different seeds), each of `--nodes` x `--ranks-per-node` rank processes
   joined by torch.distributed, alone: no scheduler, every phase passes through.
2. Starts `rlslice up --backend app` (scheduler and the first node's agent), and for
   `--nodes 2` a second `rlslice agent` (node `node-b`) on loopback; puts one group, on
   every node, whose headroom no device has, so every grant to the other job parks the
   holder: each of its ranks, on every node, moves its own tensors out.
3. Runs both jobs again at the same time on that group; each rank registers with the
   agent of its node.
4. Checks every rank's per-step losses and final weights against its run alone, bit for
   bit, and that the ranks of a job agree; reads the switches from the scheduler, and
   what each rank moved (bytes, seconds) from the rank itself.

Prints a table; exits 0 only when everything is identical and the switches moved bytes.
`--json FILE` writes the figures.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TRAIN = HERE / "train.py"
GROUP = "ddp-tiny"
#: Larger than any device: no two jobs fit side by side, so every switch moves state.
HEADROOM_BYTES = 1 << 50


def _grpo_compare() -> Any:
    """examples/grpo_tiny/compare.py, whose `rlslice up` runner this one reuses."""
    spec = importlib.util.spec_from_file_location(
        "grpo_tiny_compare", HERE.parent / "grpo_tiny" / "compare.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


GRPO = _grpo_compare()


@dataclass(frozen=True)
class RankVerdict:
    """One rank's sliced run against its run alone."""

    job: str
    rank: int
    node: str
    losses_identical: bool
    weights_identical: bool
    offloads: int
    moved_bytes: int
    """Bytes this rank's offloader moved out and back in the sliced run."""
    switch_seconds: float
    """Seconds this rank's offloader spent moving (out and in)."""


def judge(job: str, node: str, alone: Mapping[str, Any], sliced: Mapping[str, Any]) -> RankVerdict:
    """Compare two runs of one rank (the JSON `train.py --out` writes)."""
    moves = sliced["moves"]
    return RankVerdict(
        job=job,
        rank=int(sliced["rank"]),
        node=node,
        losses_identical=alone["losses"] == sliced["losses"],
        weights_identical=alone["weights_sha256"] == sliced["weights_sha256"],
        offloads=sum(1 for m in moves if m["move"] == "offload" and m["bytes"] > 0),
        moved_bytes=sum(int(m["bytes"]) for m in moves),
        switch_seconds=sum(float(m["seconds"]) for m in moves),
    )


def node_of(rank: int, ranks_per_node: int) -> str:
    return "node-a" if rank < ranks_per_node else "node-b"


def _jobs(
    args: argparse.Namespace,
    work: Path,
    label: str,
    env: Mapping[str, str],
    sockets: Mapping[str, str] | None,
) -> dict[str, list[dict[str, Any]]]:
    """Run both jobs at once, every rank a process, their loops started together; each
    job's per-rank `--out` JSON, by job, in rank order."""
    barrier = work / f"barrier-{label}"
    barrier.mkdir()
    world = args.nodes * args.ranks_per_node
    running: list[tuple[str, int, Path, subprocess.Popen[bytes]]] = []
    for index, seed in enumerate(args.seeds):
        job = f"ddp-{'ab'[index]}"
        port = GRPO._free_port()
        for rank in range(world):
            out = work / f"{job}-{label}-rank{rank}.json"
            rank_env = {
                **env,
                "RANK": str(rank),
                "WORLD_SIZE": str(world),
                "LOCAL_RANK": str(rank % args.ranks_per_node),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            }
            if sockets is not None:  # each rank talks to the agent of its own node
                rank_env["RLSLICE_AGENT_SOCKET"] = sockets[node_of(rank, args.ranks_per_node)]
            argv = [
                sys.executable, str(TRAIN), "--job", job, "--group", GROUP, "--seed", str(seed),
                "--steps", str(args.steps), "--device", args.device, "--out", str(out),
                "--quiet", "--barrier", str(barrier),
            ]  # fmt: skip
            if sockets is None:
                argv.append("--alone")
            log = (work / f"{job}-{label}-rank{rank}.log").open("wb")
            process = subprocess.Popen(argv, env=rank_env, stdout=log, stderr=subprocess.STDOUT)
            log.close()
            running.append((job, rank, out, process))
    jobs = [f"ddp-{'ab'[i]}" for i in range(len(args.seeds))]
    GRPO._release(barrier, jobs, [p for _, r, _, p in running if r == 0], args.timeout)
    results: dict[str, list[dict[str, Any]]] = {job: [] for job in jobs}
    deadline = time.monotonic() + args.timeout
    for job, rank, out, process in running:
        try:
            code = process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for *_, other in running:
                other.kill()
            raise RuntimeError(f"{job} rank {rank} ({label}) did not finish: see {work}") from None
        if code != 0:
            tail = (work / f"{job}-{label}-rank{rank}.log").read_text()[-2000:]
            raise RuntimeError(f"{job} rank {rank} ({label}) exited with {code}:\n{tail}")
        results[job].append(json.loads(out.read_text()))
    return results


@contextmanager
def second_agent(work: Path, address: str, env: Mapping[str, str]) -> Iterator[str]:
    """`rlslice agent` for node-b, registered with the scheduler at `address`; yields its
    socket once it serves."""
    socket_path = work / "node-b.sock"
    argv = [
        sys.executable, "-m", "rlslice.apps", "--log-level", "WARNING", "agent",
        "--node", "node-b", "--address", f"127.0.0.1:{GRPO._free_port()}",
        "--socket", str(socket_path), "--state-dir", str(work / "agent-b"),
        "--sim-root", str(work / "sim-b"), "--backend", "app", "--host-reserve", "0",
        "--scheduler", address,
    ]  # fmt: skip
    log = (work / "agent-b.log").open("wb")
    agent = subprocess.Popen(argv, env=dict(env), stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not socket_path.exists():
            if agent.poll() is not None:
                raise RuntimeError(f"rlslice agent exited: see {work / 'agent-b.log'}")
            if time.monotonic() > deadline:
                raise TimeoutError("rlslice agent for node-b did not serve within 60 s")
            time.sleep(0.05)
        yield str(socket_path)
    finally:
        agent.terminate()
        try:
            agent.wait(timeout=20)
        except subprocess.TimeoutExpired:
            agent.kill()
        log.close()


def put_group(address: str, nodes: int, timeout: float = 60.0) -> None:
    """Create the group (app backend, headroom) and wait until every agent takes part."""
    import grpc

    from rlslice.adapters.wire import group_spec_to_proto
    from rlslice.config import GroupSpec
    from rlslice.v1alpha1 import scheduler_pb2, scheduler_pb2_grpc

    spec = GroupSpec(name=GROUP, backend="app", headroom_bytes=HEADROOM_BYTES, lease_seconds=60)
    with grpc.insecure_channel(address) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        stub.PutGroup(scheduler_pb2.PutGroupRequest(spec=group_spec_to_proto(spec)), timeout=10)
        deadline = time.monotonic() + timeout
        while True:  # agents register with the scheduler on their own schedule
            status = stub.GetGroup(scheduler_pb2.GetGroupRequest(group=GROUP), timeout=10)
            if len(status.nodes) >= nodes:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{nodes} agents did not join group {GROUP} in {timeout:.0f} s")
            time.sleep(0.1)


def switches(address: str) -> int:
    """Switches the scheduler counted on the group."""
    import grpc

    from rlslice.v1alpha1 import scheduler_pb2, scheduler_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        return int(stub.GetGroup(scheduler_pb2.GetGroupRequest(group=GROUP), timeout=10).switches)


def table(verdicts: list[RankVerdict], group_switches: int) -> str:
    """The comparison as fixed-width text, one line per rank."""

    def same(flag: bool) -> str:
        return "identical" if flag else "DIFFERENT"

    head = (
        f"{'job':<6} {'rank':>4} {'node':<7} {'losses':<9}  {'weights':<9}  "
        f"{'offloads':>8}  {'moved MB':>8}  {'switch s':>8}"
    )
    lines = [head, "-" * len(head)]
    for v in verdicts:
        lines.append(
            f"{v.job:<6} {v.rank:>4} {v.node:<7} {same(v.losses_identical):<9}  "
            f"{same(v.weights_identical):<9}  {v.offloads:>8}  {v.moved_bytes / 1e6:>8.3f}  "
            f"{v.switch_seconds:>8.4f}"
        )
    lines.append(f"group {GROUP}: {group_switches} switches")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1, choices=[1, 2])
    parser.add_argument("--ranks-per-node", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seeds", type=int, nargs=2, default=[1, 2])
    parser.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, JSON)")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="ddp-tiny-", dir="/tmp"))
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    for name in ("RLSLICE_SCHEDULER", "RLSLICE_AGENT_SOCKET", "RLSLICE_AGENT_REGISTERED"):
        env.pop(name, None)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "RLSLICE_RANKS"):
        env.pop(name, None)
    try:
        started = time.perf_counter()
        alone = _jobs(args, work, "alone", env, None)
        with ExitStack() as stack:
            address, socket_a = stack.enter_context(GRPO.rlslice_up(work, "app", env))
            sockets = {"node-a": socket_a}
            if args.nodes == 2:
                sockets["node-b"] = stack.enter_context(second_agent(work, address, env))
            put_group(address, args.nodes)
            sliced = _jobs(args, work, "sliced", {**env, "RLSLICE_SCHEDULER": address}, sockets)
            group_switches = switches(address)
        verdicts = [
            judge(job, node_of(rank, args.ranks_per_node), alone[job][rank], sliced[job][rank])
            for job in sorted(alone)
            for rank in range(len(alone[job]))
        ]
        agree = all(
            len({r["weights_sha256"] for r in runs[job]}) == 1 and
            len({tuple(r["losses"]) for r in runs[job]}) == 1
            for runs in (alone, sliced)
            for job in runs
        )  # fmt: skip
        moved = sum(v.moved_bytes for v in verdicts)
        # What the agents reported for each job's restores, through the scheduler's grants
        # (rank 0's grants: the one Acquire of each phase, shared with every rank).
        granted = {job: sum(g["moved_bytes"] for g in sliced[job][0]["grants"]) for job in sliced}
        identical = all(v.losses_identical and v.weights_identical for v in verdicts)
        every_rank_moved = all(v.moved_bytes > 0 for v in verdicts)
        ok = identical and agree and group_switches > 0 and every_rank_moved
        ok = ok and all(value > 0 for value in granted.values())
        print(f"nodes {args.nodes}, {args.ranks_per_node} ranks per node, device {args.device}")
        print(table(verdicts, group_switches))
        print(f"ranks of each job agree: {agree}")
        print(
            "moved by the agents (grants): "
            + ", ".join(f"{j} {b / 1e6:.3f} MB" for j, b in granted.items())
        )
        print(f"{'OK' if ok else 'FAILED'} in {time.perf_counter() - started:.1f} s")
        if args.json is not None:
            args.json.write_text(
                json.dumps(
                    {
                        "ok": ok,
                        "nodes": args.nodes,
                        "switches": group_switches,
                        "moved_bytes": moved,
                        "granted_moved_bytes": granted,
                        "ranks_agree": agree,
                        "ranks": [asdict(v) for v in verdicts],
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
