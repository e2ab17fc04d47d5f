"""End to end on a real GPU: two torch jobs time-sliced through `rlslice up` (`cuda` or `app`).

    python3 tools/gpu_e2e.py --gib 2 --steps 8 --out OUT.json
    python3 tools/gpu_e2e.py --backend app --gib 2 --steps 8 --out OUT.json

Starts `rlslice up` (scheduler + agent, `cuda` backend) as a subprocess, puts a group whose
headroom leaves room for one job only (so every switch really checkpoints a process through
the CUDA driver), then runs each job once alone (no scheduler) and then both together.
Each job registers its own process with the agent through the client (peer credentials),
holds `--gib` GiB of parameters on the GPU and runs a deterministic training loop with
`client.phase("train")` around each step and CPU work between steps. Reports switches,
bytes moved, switch seconds, and whether every job's losses are bit-identical to its run
alone (invariant 5). Exits 0 only when the losses match and switches happened.

`job` mode (internal): `python3 tools/gpu_e2e.py job NAME GIB STEPS SEED OUT [--alone]`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GiB = 1 << 30
JOBS = ("job-a", "job-b")


def _build(gib: float, seed: int, device: str) -> dict[str, Any]:
    """The job's deterministic training state: ballast (`gib` of device state), a model."""
    import torch

    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    width = 4096
    # Ballast brings the job's device state to `gib`; the model trains on top of it.
    ballast = torch.randn(int(gib * GiB) // 4, device=device)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.Tanh(), torch.nn.Linear(width, 1)
    ).to(device)
    return {
        "width": width,
        "ballast": ballast,
        "model": model,
        "optimizer": torch.optim.SGD(model.parameters(), lr=1e-3),
        "inputs": torch.randn(256, width, device=device),
        "targets": torch.randn(256, 1, device=device),
    }


def _offload_thread(name: str, state: dict[str, Any]) -> Any:
    """The `app` backend: the job offloads itself on the agent's command. Its offload thread
    registers the process with the agent; the client must not do it again."""
    from rlslice.client.offload import TorchOffloader, start_offload_thread

    offloader = TorchOffloader()
    offloader.register(state["model"], "weights")
    offloader.register(state["optimizer"], "optimizer")
    offloader.register([state["ballast"], state["inputs"], state["targets"]], "data")
    socket_path = os.environ.pop("RLSLICE_AGENT_SOCKET")
    offload = start_offload_thread(offloader, job=name, group="h200", socket_path=socket_path)
    offload.wait_connected()  # registered and streaming before the first switch
    return offload


def _step(state: dict[str, Any]) -> tuple[str, float]:
    """One training step: (its loss as float.hex(), a checksum of the ballast)."""
    import torch

    optimizer, ballast, width = state["optimizer"], state["ballast"], state["width"]
    optimizer.zero_grad()
    prediction = state["model"](state["inputs"] + ballast[:width].sum() * 0)
    loss = torch.nn.functional.mse_loss(prediction, state["targets"])
    loss.backward()
    optimizer.step()
    return loss.item().hex(), float(ballast[:: 1 << 20].sum().item())


def run_job(
    name: str, gib: float, steps: int, seed: int, out: Path, alone: bool, device: str
) -> None:
    """One job: `steps` steps in `client.phase("train")`, CPU time between; results to `out`."""
    from rlslice.client import Client

    state = _build(gib, seed, device)
    offload = None
    if os.environ.get("GPU_E2E_BACKEND") == "app" and not alone:
        offload = _offload_thread(name, state)
    client = Client(
        job=name,
        group="h200",
        scheduler=None if alone else os.environ["RLSLICE_SCHEDULER"],
        lease_seconds=60.0,
        device_bytes=int(gib * GiB) + 2 * state["width"] ** 2 * 4,
    )
    losses: list[str] = []
    grants: list[dict[str, Any]] = []
    checks: list[float] = []
    for step in range(steps):
        with client.phase("train") as grant:
            loss, check = _step(state)
        losses.append(loss)
        checks.append(check)
        grants.append(
            {
                "step": step,
                "restored": grant.restored,
                "switch_seconds": grant.switch_seconds,
                "moved_bytes": grant.moved_bytes,
                "waited_seconds": grant.waited_seconds,
            }
        )
        time.sleep(0.3)  # CPU phase: reward scoring; the other job may hold the GPU now
    client.close()
    if offload is not None:
        offload.stop()
    out.write_text(json.dumps({"losses": losses, "grants": grants, "ballast": checks}))


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("gpu-e2e.json"))
    parser.add_argument(
        "--backend", default="cuda", choices=["cuda", "app", "sim"], help="the group's backend"
    )
    return parser.parse_args()


def _job_command(name: str, args: argparse.Namespace, seed: int, out: Path) -> list[str]:
    me = [sys.executable, str(Path(__file__).resolve())]
    return [*me, "job", name, str(args.gib), str(args.steps), str(seed), str(out)]


def _alone(args: argparse.Namespace, work: Path, env: dict[str, str]) -> dict[str, Any]:
    """Each job once alone (no scheduler): the reference losses."""
    alone = {}
    for i, name in enumerate(JOBS):
        out = work / f"{name}-alone.json"
        command = [*_job_command(name, args, 7 + i, out), "--alone"]
        subprocess.run(command, env=env, check=True, timeout=300)
        alone[name] = json.loads(out.read_text())
    return alone


def _start_up(args: argparse.Namespace, work: Path, env: dict[str, str], port: int) -> Any:
    """`rlslice up` (scheduler + agent on this node) as a subprocess, its log in `work`."""
    command = [sys.executable, "-m", "rlslice.apps", "--log-level", "INFO", "up"]
    command += ["--address", f"127.0.0.1:{port}", "--store", str(work / "s.sqlite")]
    command += ["--node", "gpu-node", "--socket", str(work / "agent.sock")]
    command += ["--state-dir", str(work / "agent"), "--backend", args.backend]
    command += ["--sim-root", str(work / "sim")]
    log = (work / "up.log").open("wb")
    return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)


def _device_total(report: dict[str, Any]) -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total)
    except Exception as error:
        report["nvml"] = str(error)
        return 143 * 10**9


def _put_group(args: argparse.Namespace, stub: Any, up: Any, report: dict[str, Any]) -> None:
    """The group, with headroom that leaves room for one job: every grant to the other job
    is a real switch. Retries until the scheduler answers (60 s)."""
    import grpc

    from rlslice.adapters.wire import group_spec_to_proto
    from rlslice.config import GroupSpec
    from rlslice.v1alpha1 import scheduler_pb2

    job_bytes = int(args.gib * GiB) + 2 * 4096 * 4096 * 4
    headroom = max(0, _device_total(report) - int(1.6 * job_bytes))
    spec = GroupSpec(name="h200", backend=args.backend, headroom_bytes=headroom, lease_seconds=60)
    deadline = time.monotonic() + 60
    while True:
        try:
            stub.PutGroup(scheduler_pb2.PutGroupRequest(spec=group_spec_to_proto(spec)), timeout=2)
            return
        except grpc.RpcError:
            if time.monotonic() > deadline or up.poll() is not None:
                raise
            time.sleep(0.3)


def _sliced(
    args: argparse.Namespace, work: Path, env: dict[str, str], address: str, report: dict[str, Any]
) -> list[tuple[str, Path]]:
    """Both jobs at once through the scheduler; (name, results file) of each."""
    deadline = time.monotonic() + 60
    while not (work / "agent.sock").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # the agent registers with the scheduler
    job_env = {
        **env,
        "RLSLICE_SCHEDULER": address,
        "RLSLICE_AGENT_SOCKET": str(work / "agent.sock"),
    }
    started = time.perf_counter()
    jobs = []
    for i, name in enumerate(JOBS):
        out = work / f"{name}-sliced.json"
        jobs.append(
            (name, out, subprocess.Popen(_job_command(name, args, 7 + i, out), env=job_env))
        )
    for name, _, process in jobs:
        report[f"{name}_exit"] = process.wait(timeout=600)
    report["sliced_wall_seconds"] = time.perf_counter() - started
    return [(name, out) for name, out, _ in jobs]


def _events(stub: Any, report: dict[str, Any]) -> None:
    from rlslice.v1alpha1 import scheduler_pb2

    status = stub.GetGroup(scheduler_pb2.GetGroupRequest(group="h200"), timeout=5)
    report["group_switches"] = status.switches
    events = stub.GetEvents(scheduler_pb2.GetEventsRequest(group="h200"), timeout=5).events
    kinds = (
        scheduler_pb2.EVENT_KIND_SWITCH_DONE,
        scheduler_pb2.EVENT_KIND_SWITCH_FAILED,
        scheduler_pb2.EVENT_KIND_FAILED,
        scheduler_pb2.EVENT_KIND_FAULTED,
    )
    report["events"] = [
        f"{scheduler_pb2.EventKind.Name(e.kind)} {e.job} {e.seconds:.3f}s {e.bytes} {e.detail}"
        for e in events
        if e.kind in kinds
    ][:40]


def _judge(report: dict[str, Any], jobs: list[tuple[str, Path]], alone: dict[str, Any]) -> None:
    """Per job: losses and ballast bit-identical to its run alone, what moved; then `ok`."""
    ok = True
    for name, out in jobs:
        sliced = json.loads(out.read_text())
        same = sliced["losses"] == alone[name]["losses"]
        same_ballast = sliced["ballast"] == alone[name]["ballast"]
        moves = [g for g in sliced["grants"] if g["moved_bytes"] > 0]
        report[name] = {
            "losses_bit_identical": same,
            "ballast_identical": same_ballast,
            "restored_grants": sum(1 for g in sliced["grants"] if g["restored"]),
            "moved_bytes": sum(g["moved_bytes"] for g in moves),
            "switch_seconds": [round(g["switch_seconds"], 3) for g in moves],
        }
        ok = ok and same and same_ballast
    moved = sum(report[n]["moved_bytes"] for n in JOBS)
    seconds = sum(sum(report[n]["switch_seconds"]) for n in JOBS)
    report["switch_gb_per_s"] = moved / seconds / 1e9 if seconds else None
    report["ok"] = ok and report["group_switches"] > 0 and moved > 0


def _stop(up: Any, work: Path, report: dict[str, Any]) -> None:
    up.terminate()
    try:
        up.wait(timeout=20)
    except subprocess.TimeoutExpired:
        up.kill()
    report["up_log_tail"] = (work / "up.log").read_text()[-3000:]


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "job":
        name, gib, steps, seed, out = sys.argv[2:7]
        device = os.environ.get("GPU_E2E_DEVICE", "cuda")
        run_job(name, float(gib), int(steps), int(seed), Path(out), "--alone" in sys.argv, device)
        return 0
    args = _parse()
    os.environ["GPU_E2E_BACKEND"] = args.backend
    if args.backend == "sim":
        os.environ["GPU_E2E_DEVICE"] = "cpu"

    import grpc

    from rlslice.testing import free_port
    from rlslice.v1alpha1 import scheduler_pb2_grpc

    work = Path(tempfile.mkdtemp(prefix="rlslice-gpu-e2e-"))
    env = dict(os.environ)
    report: dict[str, Any] = {"gib": args.gib, "steps": args.steps}
    alone = _alone(args, work, env)
    port = free_port()
    up = _start_up(args, work, env, port)
    try:
        address = f"127.0.0.1:{port}"
        stub = scheduler_pb2_grpc.SchedulerStub(grpc.insecure_channel(address))
        _put_group(args, stub, up, report)
        jobs = _sliced(args, work, env, address, report)
        _events(stub, report)
        _judge(report, jobs, alone)
    finally:
        _stop(up, work, report)
    args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "up_log_tail"}, indent=2))
    return 0 if report.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
