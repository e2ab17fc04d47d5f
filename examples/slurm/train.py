"""An RL-shaped job for `two_node_group.sbatch`: one task per node, started as

    srun --ntasks-per-node=1 rlslice run --job grpo-a --group pair -- python3 train.py

Rank 0 (`SLURM_PROCID=0`) is the driver: it holds the job's `rlslice.Client` and wraps
the GPU phases (`load`, then `rollout` and `train` every step) in `client.phase()`; reward
scoring runs on the CPU between them, while the other job may use the GPUs. Every rank
starts a GPU worker (`worker.py`) on its node and tells it what to run; with several nodes
rank 0 sends each command to the other ranks over torch.distributed (gloo), as RL
frameworks do.

Registration: under `rlslice run` (without `--no-register`) the whole task is registered
with the node's agent, right for the `cuda` backends. On `sim`, where a parked job's
registered processes are stopped, the sbatch script passes `--no-register` and only the
worker registers (through `rlslice run`), so the driver keeps scoring while parked; the
driver drops RLSLICE_AGENT_SOCKET before it builds its Client, which would otherwise
register the driver's own process.

Prints one line per phase (`grant`: waited, restored, moved bytes) and `done` at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from rlslice import Client

HERE = Path(__file__).resolve().parent


class LocalWorker:
    """This node's GPU worker, over JSON lines."""

    def __init__(self, state_bytes: int, seed: int, agent_socket: str | None) -> None:
        argv = [sys.executable, str(HERE / "worker.py"), str(state_bytes), str(seed)]
        if agent_socket is not None:
            # Register the worker alone (the driver is not registered).
            run = [sys.executable, "-m", "rlslice.apps", "run", "--agent-wait", "60"]
            argv = [*run, "--agent-socket", agent_socket, "--", *argv]
        self.process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self._in: IO[str] = self.process.stdin
        self._out: IO[str] = self.process.stdout

    def call(self, **command: Any) -> dict[str, Any]:
        self._in.write(json.dumps(command) + "\n")
        self._in.flush()
        line = self._out.readline()
        if not line:
            raise SystemExit(f"worker exited with {self.process.wait()}")
        answer: dict[str, Any] = json.loads(line)
        if not answer.get("ok"):
            raise SystemExit(f"worker: {answer.get('error')}")
        return answer

    def close(self) -> None:
        self.call(op="quit")
        self.process.wait(timeout=30)


class Ranks:
    """Rank 0's commands reach every rank (torch.distributed with more than one task)."""

    def __init__(self) -> None:
        self.rank = int(os.environ.get("SLURM_PROCID", "0"))
        self.world = int(os.environ.get("SLURM_NTASKS", "1"))
        self._dist: Any = None
        if self.world > 1:
            import torch.distributed as dist

            from rlslice.apps.shared.slurm import expand_hostlist

            head = expand_hostlist(os.environ["SLURM_JOB_NODELIST"])[0]
            job, step = int(os.environ["SLURM_JOB_ID"]), int(os.environ.get("SLURM_STEP_ID", 0))
            port = os.environ.get("MASTER_PORT") or str(40000 + (job % 2000) * 10 + step % 10)
            dist.init_process_group(
                "gloo",
                init_method=f"tcp://{os.environ.get('MASTER_ADDR', head)}:{port}",
                rank=self.rank,
                world_size=self.world,
            )
            self._dist = dist

    def share(self, command: dict[str, Any] | None) -> dict[str, Any]:
        """Rank 0 passes its command; every rank gets it back."""
        if self._dist is None:
            assert command is not None
            return command
        box = [command]
        self._dist.broadcast_object_list(box, src=0)
        return dict(box[0] or {})

    def barrier(self) -> None:
        if self._dist is not None:
            self._dist.barrier()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=int(os.environ.get("TRAIN_STEPS", 4)))
    parser.add_argument("--state-mib", type=int, default=int(os.environ.get("TRAIN_STATE_MIB", 64)))
    parser.add_argument("--gpu-seconds", type=float, default=0.3, help="each GPU phase")
    parser.add_argument("--cpu-seconds", type=float, default=0.3, help="reward scoring")
    args = parser.parse_args()
    # Slurm cancels, preempts and times out with SIGTERM (SIGKILL follows KillWait later):
    # leave the phase and close the client, so the other job is granted now rather than
    # when this job's lease lapses.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    job = os.environ["RLSLICE_JOB"]
    agent_socket = None
    if os.environ.get("RLSLICE_AGENT_REGISTERED") != "1":
        # Not registered (sim): keep it so. A Client that sees RLSLICE_AGENT_SOCKET
        # registers its own process, and the driver would be stopped with its worker.
        agent_socket = os.environ.pop("RLSLICE_AGENT_SOCKET", None)
    ranks = Ranks()
    seed = sum(map(ord, job)) + ranks.rank
    worker = LocalWorker(args.state_mib << 20, seed, agent_socket)

    def everywhere(command: dict[str, Any] | None) -> dict[str, Any]:
        shared = ranks.share(command)
        answer = worker.call(**shared) if shared["op"] != "stop" else {}
        ranks.barrier()
        return {**shared, **answer}

    if ranks.rank != 0:
        while everywhere(None)["op"] != "stop":
            pass
        worker.close()
        return 0

    started = time.monotonic()
    # Job, group, scheduler and token come from the environment `rlslice run` and the
    # sbatch script set. device_bytes (per node) lets the scheduler make room before the
    # first load instead of restoring this job beside another that fills the GPUs.
    visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",") if v.strip()]
    with Client(device_bytes=(args.state_mib << 20) * max(1, len(visible))) as client:
        # Every worker answers once it runs, so registered with its agent (`rlslice run`
        # registers before it starts the command): the scheduler knows on which nodes the
        # job's state lives before its first grant.
        everywhere({"op": "hello"})
        with client.phase("load") as grant:
            devices = everywhere({"op": "init"})["devices"]
        print(f"{job}: load on {', '.join(devices)}", flush=True)
        for step in range(args.steps):
            with client.phase("rollout") as grant:
                everywhere({"op": "rollout", "seconds": args.gpu_seconds})
            _report(job, step, "rollout", grant)
            time.sleep(args.cpu_seconds)  # CPU: reward scoring, another job may use the GPUs
            reward = random.random()
            with client.phase("train") as grant:
                everywhere({"op": "train", "seconds": args.gpu_seconds, "reward": reward})
            _report(job, step, "train", grant)
    everywhere({"op": "stop"})
    worker.close()
    print(f"{job}: done, {args.steps} steps in {time.monotonic() - started:.1f} s", flush=True)
    return 0


def _report(job: str, step: int, phase: str, grant: Any) -> None:
    print(
        f"{job}: step {step} {phase} grant waited {grant.waited_seconds:.2f} s "
        f"restored {grant.restored} moved {grant.moved_bytes} bytes",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
