"""`rlslice run --job J --group G -- CMD...`: run a command as a job registered with the
node's snapshot agent.

The wrapper forks; the child registers itself with the agent (its pid is read from the
socket's peer credentials), sets the job's environment, then execs CMD under the same pid,
so CMD is registered before it runs a line. The parent waits, forwards signals (those a
terminal sends to the whole process group reach CMD directly and are not sent twice), and
exits with CMD's status (128 + N when CMD died of signal N).

Environment given to CMD: RLSLICE_JOB, RLSLICE_GROUP, RLSLICE_AGENT_SOCKET,
RLSLICE_AGENT_REGISTERED=1, RLSLICE_NODE (the agent's node name), and RLSLICE_SCHEDULER
when --scheduler is given. `--transparent` also preloads torch-memory-saver's hook library
(LD_PRELOAD, before any already there), so `MemorySaverOffloader` can park what the job
allocates in its regions without `register` calls (docs/backends.md).

Inside a Slurm allocation (`srun rlslice run -- python train.py`) the job and group default
to the allocation's (`rlslice.apps.shared.slurm`): job `slurm-<SLURM_JOB_ID>`, group named after
the allocation's nodes; RLSLICE_NODE is this node's Slurm name as an agent id even with
--no-register; CUDA_VISIBLE_DEVICES (Slurm's `--gres` binding) passes through, and the
`sim` backend's devices follow it. `--print-group-config` prints the scheduler's
`--group-config` for the allocation (one group over its nodes) and exits.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from rlslice import env as env_names

ENV_JOB = env_names.JOB
ENV_GROUP = env_names.GROUP
ENV_SCHEDULER = env_names.SCHEDULER
ENV_AGENT_SOCKET = env_names.AGENT_SOCKET
ENV_AGENT_REGISTERED = env_names.AGENT_REGISTERED
ENV_NODE = env_names.NODE

# Signals passed on to CMD. SIGCHLD is waited for alongside them.
_FORWARDED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGWINCH")
_SI_KERNEL = 0x80  # si_code of a signal the kernel (a terminal) sent: CMD already has it


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--job",
        default=os.environ.get(ENV_JOB),
        help="job id ($RLSLICE_JOB; in a Slurm allocation slurm-$SLURM_JOB_ID)",
    )
    parser.add_argument(
        "--group",
        default=os.environ.get(ENV_GROUP),
        help="group id ($RLSLICE_GROUP; in a Slurm allocation, named after its nodes)",
    )
    parser.add_argument(
        "--agent-socket",
        default=None,
        help="the agent's Unix socket ($RLSLICE_AGENT_SOCKET, else the agent's default)",
    )
    parser.add_argument("--scheduler", default=None, help="scheduler address for the job's client")
    parser.add_argument("--backend", default="", help="backend to ask for (default: the group's)")
    parser.add_argument(
        "--agent-wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="keep trying an agent that is not up yet (its socket missing or silent) for "
        "this long (default 0: fail at once); a Slurm step started beside the agent's needs it",
    )
    parser.add_argument(
        "--no-register",
        action="store_true",
        help="do not register with an agent (the job cannot be snapshotted)",
    )
    parser.add_argument(
        "--transparent",
        action="store_true",
        help="preload torch-memory-saver's hook library (LD_PRELOAD) for the app backend's "
        "transparent path; needs `pip install torch-memory-saver`",
    )
    parser.add_argument(
        "--print-group-config",
        action="store_true",
        help="print the scheduler's --group-config for this Slurm allocation and exit",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")


def run(args: argparse.Namespace) -> int:
    import signal
    import sys

    from rlslice._errors import InvalidArgumentError
    from rlslice._ids import validate_id
    from rlslice.apps.shared.slurm import allocation_from, group_config_yaml
    from rlslice.client._local import default_socket_path

    allocation = allocation_from(os.environ)
    if allocation is not None:
        args.job = args.job or allocation.job
        args.group = args.group or allocation.group
    if args.print_group_config:
        if allocation is None:
            print("rlslice run: --print-group-config needs a Slurm allocation", file=sys.stderr)
            return 2
        try:
            group = validate_id(args.group, "group")
        except InvalidArgumentError as error:
            print(f"rlslice run: {error}", file=sys.stderr)
            return 2
        print(group_config_yaml(allocation, group=group, backend=args.backend or "sim"), end="")
        return 0
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print(
            "rlslice run: no command given (rlslice run --job J --group G -- CMD)", file=sys.stderr
        )
        return 2
    try:
        job = validate_id(args.job or "", "job")
        group = validate_id(args.group or "", "group")
    except InvalidArgumentError as error:
        print(f"rlslice run: {error}", file=sys.stderr)
        return 2
    socket_path = str(args.agent_socket or default_socket_path())
    args.preload = ""
    if args.transparent:
        from rlslice._errors import FailedPreconditionError
        from rlslice.client.offload._memory_saver import preload_path

        try:
            args.preload = preload_path()
        except FailedPreconditionError as error:
            print(f"rlslice run: --transparent: {error}", file=sys.stderr)
            return 2

    forwarded = {getattr(signal, name) for name in _FORWARDED}
    watched = forwarded | {signal.SIGCHLD}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    pid = os.fork()
    if pid == 0:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        _child(job, group, socket_path, args, command)  # never returns
    return _wait(pid, forwarded)


def _child(
    job: str, group: str, socket_path: str, args: argparse.Namespace, command: list[str]
) -> None:
    import sys

    env = dict(os.environ)
    env.update({ENV_JOB: job, ENV_GROUP: group, ENV_AGENT_SOCKET: socket_path})
    slurm_node = os.environ.get("SLURMD_NODENAME")
    if slurm_node and ENV_NODE not in env:
        from rlslice._nodes import node_label

        env[ENV_NODE] = node_label(slurm_node)  # the agent's answer replaces it below
    if args.scheduler:
        env[ENV_SCHEDULER] = args.scheduler
    if getattr(args, "preload", ""):
        earlier = env.get("LD_PRELOAD", "")
        env["LD_PRELOAD"] = f"{args.preload}:{earlier}" if earlier else args.preload
    try:
        if not args.no_register:
            from rlslice._errors import RlsliceError

            try:
                registration = _register(socket_path, job, group, args.backend, args.agent_wait)
            except (RlsliceError, ValueError) as error:
                print(
                    f"rlslice run: cannot register with the agent at {socket_path}: {error} "
                    "(is `rlslice agent` or `rlslice up` running? --no-register skips this)",
                    file=sys.stderr,
                )
                sys.stderr.flush()
                os._exit(1)
            env[ENV_AGENT_REGISTERED] = "1"
            env[ENV_NODE] = registration.node
        sys.stdout.flush()
        os.execvpe(command[0], command, env)
    except OSError as error:
        print(f"rlslice run: {command[0]}: {error.strerror}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(127 if isinstance(error, FileNotFoundError) else 126)
    os._exit(1)  # pragma: no cover


def _register(socket_path: str, job: str, group: str, backend: str, wait: float) -> Any:
    """Register this process with the agent, trying again for `wait` seconds while the
    agent is unavailable (not started yet, or restarting)."""
    import time

    from rlslice._errors import UnavailableError
    from rlslice.client import register_with_agent

    deadline = time.monotonic() + wait
    while True:
        try:
            return register_with_agent(socket_path, job, group, backend=backend)
        except UnavailableError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def _wait(pid: int, forwarded: set[int]) -> int:
    import signal

    watched = forwarded | {signal.SIGCHLD}
    while True:
        info = signal.sigwaitinfo(watched)
        if info.si_signo == signal.SIGCHLD:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                if os.WIFSIGNALED(status):
                    return 128 + os.WTERMSIG(status)
                return os.WEXITSTATUS(status)
            continue
        if info.si_code == _SI_KERNEL and info.si_signo != signal.SIGTERM:
            continue  # typed at the terminal: the whole process group got it
        try:
            os.kill(pid, info.si_signo)
        except ProcessLookupError:
            pass
