"""One job of `rlslice bench soak`: a driver process and its GPU worker process.

    python -m rlslice.apps.bench.soak.job driver --job J --group G ... --log FILE
    python -m rlslice.apps.bench.soak.job worker JOB GROUP NODE_DIR DEVICE

The driver holds an `AsyncClient` and runs cycles of random length: acquire, check that the
worker's device bytes are what they were when the job last let go (sha256), change them
(a GPU phase), yield, then a CPU phase. Only the worker registers with the node's agent,
so only it is frozen while the job is parked, as in the demo. Every step is appended to
the shared event log as one JSON line (`os.write` on an O_APPEND descriptor: lines from
many processes never interleave), with `time.monotonic()`, which all processes share.
SIGTERM ends the driver cleanly: a blocked acquire is cancelled, the client closed.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from typing import Any

from rlslice import env as env_names
from rlslice.apps.shared.worker_pipe import WorkerPipe

PAGE = 4096


class EventLog:
    """Appends JSON lines to the soak's event log."""

    def __init__(self, path: str, **fields: Any) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._fields = fields

    def __call__(self, ev: str, **fields: Any) -> None:
        line = json.dumps({"t": time.monotonic(), "ev": ev, **self._fields, **fields})
        os.write(self._fd, (line[:4000] + "\n").encode())


# -- worker -------------------------------------------------------------------------------


def worker(job: str, group: str, node_dir: str, device_index: int) -> int:
    """Register with the agent, then answer init/step/hash/quit on stdin."""
    from rlslice import UnavailableError
    from rlslice.client import register_with_agent, sim

    give_up = time.monotonic() + 60
    while True:  # the node's agent may be down (killed by the soak) for a moment
        try:
            register_with_agent(os.environ[env_names.AGENT_SOCKET], job, group)
            break
        except UnavailableError:
            if time.monotonic() > give_up:
                raise
            time.sleep(0.2)
    out = sys.stdout
    out.write(json.dumps({"pid": os.getpid()}) + "\n")
    out.flush()
    buffer: Any = None
    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        answer: dict[str, Any] = {"ok": True}
        try:
            if op == "init":
                device = sim.attach(device_index, job=job, node_dir=node_dir)
                size = int(command["size"])
                buffer = device.alloc(size, tag="weights")
                buffer[:] = random.Random(int(command["seed"])).randbytes(size)
            elif op == "step":
                k = int(command["k"])
                for start in range((k * 131) % PAGE, len(buffer), PAGE):
                    buffer[start] = (buffer[start] + k) % 256
            elif op == "quit":
                out.write(json.dumps(answer) + "\n")
                out.flush()
                return 0
            answer["hash"] = hashlib.sha256(buffer).hexdigest() if buffer is not None else ""
        except Exception as error:  # reported to the driver, which logs it
            answer = {"ok": False, "error": f"{type(error).__name__}: {error}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()
    return 0


class _Worker(WorkerPipe):
    """The driver's pipe to its worker (blocking calls run in a thread)."""

    def __init__(self, args: argparse.Namespace) -> None:
        env = dict(os.environ)
        env[env_names.AGENT_SOCKET] = args.socket
        argv = [
            sys.executable,
            "-m",
            "rlslice.apps.bench.soak.job",
            "worker",
            args.job,
            args.group,
        ]
        argv += [args.node_dir, str(args.device)]
        super().__init__(argv, env)

    async def acall(self, **command: Any) -> dict[str, Any]:
        return await asyncio.to_thread(self.call, **command)


# -- driver -------------------------------------------------------------------------------


async def drive(args: argparse.Namespace) -> int:
    from rlslice.client import AsyncClient

    log = EventLog(args.log, job=args.job, group=args.group)
    rng = random.Random(args.seed)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    worker_proc = _Worker(args)
    hello = await asyncio.to_thread(worker_proc._out.readline)
    if not hello:
        log("crashed", error=f"the worker exited with {worker_proc.process.wait()} at start")
        return 1
    log("started", pid=os.getpid(), worker_pid=json.loads(hello)["pid"])
    client = AsyncClient(
        job=args.job,
        group=args.group,
        scheduler=args.scheduler,
        lease_seconds=args.lease,
        device_bytes=args.state_bytes,
    )

    async def until_stopped(coroutine: Any) -> Any:
        """Run `coroutine` unless SIGTERM comes first (then cancel it: no ghost waiter)."""
        task = asyncio.ensure_future(coroutine)
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise asyncio.CancelledError
        return task.result()

    try:
        await _cycles(args, log, rng, stop, client, worker_proc, until_stopped)
    except Exception as error:
        log("crashed", error=f"{type(error).__name__}: {error}")
        raise
    finally:
        log("closing")
        await client.close()
        stuck = await asyncio.to_thread(_quit, worker_proc)
        if stuck:
            log("worker_stuck", state=stuck)
        log("stopped")
    return 0


async def _cycles(
    args: argparse.Namespace,
    log: EventLog,
    rng: random.Random,
    stop: asyncio.Event,
    client: Any,
    worker_proc: _Worker,
    until_stopped: Any,
) -> None:
    from rlslice import RlsliceError

    async def ask(**command: Any) -> dict[str, Any]:
        # Stoppable: a worker fenced under a lost lock answers only once its client brings
        # it home; SIGTERM must not wait for that (closing the client resumes it).
        answer: dict[str, Any] = await until_stopped(worker_proc.acall(**command))
        return answer

    expected = ""
    step = 0
    while not stop.is_set():
        log("acquire", n=step)
        try:
            grant = await until_stopped(client.acquire(timeout=args.acquire_timeout))
        except asyncio.CancelledError:
            log("acquire_cancelled", n=step)
            break
        except RlsliceError as error:
            log("acquire_failed", n=step, kind=type(error).__name__, reason=str(error))
            await asyncio.sleep(rng.uniform(0.1, 0.5))
            continue
        log(
            "granted",
            n=step,
            epoch=grant.epoch,
            restored=grant.restored,
            moved=grant.moved_bytes,
            switch_seconds=grant.switch_seconds,
        )
        try:
            if not expected:
                answer = await ask(op="init", size=args.state_bytes, seed=args.seed)
                log("init", hash=answer["hash"])
            else:
                answer = await ask(op="hash")
                log("checked", ok=answer["hash"] == expected, want=expected, got=answer["hash"])
            step += 1
            answer = await ask(op="step", k=step)
        except asyncio.CancelledError:
            log("worker_call_cancelled", n=step)
            break
        expected = str(answer["hash"])
        await asyncio.sleep(rng.uniform(args.min_phase, args.max_phase))  # GPU phase
        log("yield", n=step)
        try:
            result = await client.yield_()
            log("yielded", waiters=result.waiters)
        except RlsliceError as error:
            log("yield_failed", kind=type(error).__name__, reason=str(error))
        with_cpu = rng.uniform(args.min_phase, args.max_phase)
        try:
            await asyncio.wait_for(stop.wait(), with_cpu)  # CPU phase
        except TimeoutError:
            pass


def _quit(worker_proc: _Worker) -> str:
    """Ask the worker to exit. "" when it did; else its /proc state ('T': frozen) before it
    was killed, 15 s later."""
    try:
        worker_proc._in.write(json.dumps({"op": "quit"}) + "\n")
        worker_proc._in.flush()
    except (OSError, ValueError):
        pass  # it is gone already
    try:
        worker_proc.process.wait(timeout=15)
        return ""
    except subprocess.TimeoutExpired:
        state = _proc_state(worker_proc.process.pid)
        worker_proc.process.kill()
        worker_proc.process.wait()
        return state


def _proc_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            text = stat.read()
    except OSError:
        return "gone"
    return text[text.rfind(")") + 2]


def driver_argv(
    *,
    scheduler: str,
    job: str,
    group: str,
    socket: str,
    node_dir: str,
    device: int,
    state_bytes: int,
    seed: int,
    log: str,
    lease: float,
    min_phase: float,
    max_phase: float,
    acquire_timeout: float,
) -> list[str]:
    """argv that starts one driver (and through it, its worker)."""
    return [
        sys.executable, "-m", "rlslice.apps.bench.soak.job", "driver",
        "--scheduler", scheduler, "--job", job, "--group", group, "--socket", socket,
        "--node-dir", node_dir, "--device", str(device), "--state-bytes", str(state_bytes),
        "--seed", str(seed), "--log", log, "--lease", repr(lease),
        "--min-phase", repr(min_phase), "--max-phase", repr(max_phase),
        "--acquire-timeout", repr(acquire_timeout),
    ]  # fmt: skip


def main(argv: list[str]) -> int:
    if argv and argv[0] == "worker":
        job, group, node_dir, device = argv[1:5]
        return worker(job, group, node_dir, int(device))
    parser = argparse.ArgumentParser(prog="soak-job")
    parser.add_argument("role", choices=["driver"])
    for flag in ("scheduler", "job", "group", "socket", "node-dir", "log"):
        parser.add_argument(f"--{flag}", required=True)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--state-bytes", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lease", type=float, default=3.0)
    parser.add_argument("--min-phase", type=float, default=0.1)
    parser.add_argument("--max-phase", type=float, default=1.0)
    parser.add_argument("--acquire-timeout", type=float, default=30.0)
    return asyncio.run(drive(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
