"""A real Slurm cluster for the tests: `munged`, `slurmctld` and two `slurmd` (nodes `rl1`
and `rl2`, both on this host, each with its own port, spool and log) started from a
generated `slurm.conf` and munge key in a temporary directory, stopped by pid and removed at
the end. One-node tests pin themselves to `rl1`; the multi-node test spans both.

Needs Debian's `slurmctld`, `slurmd`, `slurm-client` and `munge` (`.ci/run` installs them)
and root (slurmd launches jobs as their users; the privacy test reads as `nobody`). Without
them the tests skip, except under `CI=true`, where they fail.

Each node has two GPUs for `--gres=gpu:N`: gres.conf points at two links to /dev/null, so
Slurm binds them and sets `CUDA_VISIBLE_DEVICES` as it does for real GPUs (task/none: no
device cgroup is enforced). Accounting is off: job states come from `scontrol show job`.
The tests run as root, so `Slurm.processes()` reads every process's argv and environment.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rlslice.testing import free_port

TOOLS = ("munged", "munge", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "scancel")
VENV_BIN = Path(sys.executable).parent
DONE_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {reason}: .ci/run installs Slurm and munge", pytrace=False)
    pytest.skip(reason)


@dataclass(frozen=True)
class Proc:
    """One process: pid, state letter (R, S, T, Z, ...), argv and environment."""

    pid: int
    state: str
    argv: bytes
    environ: bytes


def processes() -> list[Proc]:
    """Every process this host shows now (those that vanish while read are left out)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        state = stat.rpartition(")")[2].split()[0]
        found.append(Proc(int(entry.name), state, argv, environ))
    return found


def of_job(job_id: str) -> list[Proc]:
    """The live processes of Slurm job `job_id` (by SLURM_JOB_ID in their environment)."""
    marker = f"SLURM_JOB_ID={job_id}".encode()
    return [
        p
        for p in processes()
        if p.state != "Z" and any(item == marker for item in p.environ.split(b"\0"))
    ]


@dataclass
class Slurm:
    """A running one-node cluster and the client environment that reaches it."""

    root: Path
    nodes: tuple[str, ...]
    env: dict[str, str]
    pids: dict[str, int] = field(default_factory=dict)

    def run(self, *argv: str, timeout: float = 30) -> str:
        """Run a Slurm client command; its stdout."""
        done = subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )
        assert done.returncode == 0, f"{argv}: {done.stderr}"
        return done.stdout

    def sbatch(self, *argv: str, env: dict[str, str] | None = None) -> str:
        """Submit; the job id."""
        done = subprocess.run(
            ["sbatch", "--parsable", *argv],
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict of its KEY=VALUE fields."""
        text = self.run("scontrol", "show", "job", "--oneliner", job_id)
        return dict(re.findall(r"(\w+)=(\S*)", text))

    @property
    def node(self) -> str:
        """The first node, where one-node tests run."""
        return self.nodes[0]

    processes = staticmethod(processes)
    of_job = staticmethod(of_job)

    def wait_done(self, job_id: str, timeout: float) -> dict[str, str]:
        """Poll until the job reaches a final state; its fields."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            fields = self.job(job_id)
            if fields.get("JobState") in DONE_STATES:
                return fields
            time.sleep(0.2)
        fields = self.job(job_id)
        raise AssertionError(
            f"job {job_id} still {fields.get('JobState')} (reason {fields.get('Reason')}); "
            f"nodes: {self.node_states()}"
        )

    def node_states(self) -> dict[str, str]:
        """Each node's state as `sinfo` shows it (idle, mixed, allocated, completing, drain...)."""
        out = self.run("sinfo", "--noheader", "--Node", "--format", "%N %T")
        return dict(line.split() for line in out.splitlines() if line.strip())

    def settle(self, timeout: float = 60.0) -> None:
        """Wait until every node is idle again, resuming any a previous test left drained or
        down (a job killed late drains its node): each test starts on an idle cluster."""
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            states = self.node_states()
            if all(state == "idle" for state in states.values()) and len(states) == len(self.nodes):
                return
            for node, state in states.items():
                if state.rstrip("*~#!%$@^-") in ("drained", "draining", "drain", "down"):
                    self.run("scontrol", "update", f"NodeName={node}", "State=RESUME")
            time.sleep(0.2)
        raise AssertionError(f"the Slurm nodes did not become idle: {states}")


def _write_config(root: Path, host: str, nodes: tuple[str, ...]) -> Path:
    (root / "gpus").mkdir()
    for index in range(2):
        (root / "gpus" / f"gpu{index}").symlink_to("/dev/null")  # a character device
    for name in ("state", "spool", "log"):
        (root / name).mkdir()
    cpus = os.cpu_count() or 1
    conf = root / "slurm.conf"
    node_lines = "".join(
        f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={free_port()} "
        f"CPUs={cpus} RealMemory=1000 Gres=gpu:2 State=UNKNOWN\n"
        for node in nodes
    )
    conf.write_text(
        f"""ClusterName=rlslice-test
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={free_port()}
AuthType=auth/munge
AuthInfo=socket={root}/munge-run/socket
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
KillWait=12
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
GresTypes=gpu
{node_lines}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE OverSubscribe=FORCE:4 State=UP
"""
    )
    (root / "gres.conf").write_text(f"Name=gpu File={root}/gpus/gpu[0-1]\n")
    return conf


def _stop(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid if not Path(f"/proc/{pid}").exists() else 0
        if done == pid:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slurm]:
    """A one-node Slurm cluster, up and idle."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        _unavailable(f"{', '.join(missing)} not installed (apt-get install slurmctld slurmd munge)")
    if os.geteuid() != 0:
        _unavailable("the Slurm tests run slurmd as root (it launches jobs as their users)")
    root = tmp_path_factory.mktemp("slurm")
    root.chmod(0o755)  # jobs of other users reach the munge socket through it
    host = socket.gethostname().split(".")[0]
    nodes = ("rl1", "rl2")
    conf = _write_config(root, host, nodes)
    (root / "munge").mkdir(mode=0o700)
    (root / "munge-run").mkdir(mode=0o755)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    # Not this process's RLSLICE_* variables: an earlier test's client may have set
    # RLSLICE_AGENT_REGISTERED here, which would tell every job's worker that it is
    # registered already (it is not: nothing of it would ever move).
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("RLSLICE_")}
    env = {
        **inherited,
        "SLURM_CONF": str(conf),
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONSAFEPATH": "1",
    }
    cluster = Slurm(root, nodes, env)
    logs = root / "log"
    started: list[subprocess.Popen[bytes]] = []

    def start(name: str, argv: list[str]) -> None:
        with open(logs / f"{name}.out", "wb") as out:
            process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        started.append(process)
        cluster.pids[name] = process.pid

    try:
        start(
            "munged",
            [
                "munged",
                "--foreground",
                "--force",
                f"--key-file={key}",
                f"--socket={root}/munge-run/socket",
                f"--pid-file={root}/munge/munged.pid",
                f"--log-file={logs}/munged.log",
                f"--seed-file={root}/munge/seed",
            ],
        )
        _wait_for(lambda: (root / "munge-run" / "socket").exists(), 15, "munged's socket", logs)
        start("slurmctld", ["slurmctld", "-D", "-f", str(conf)])
        for node in nodes:
            start(f"slurmd-{node}", ["slurmd", "-D", "-f", str(conf), "-N", node])

        def idle() -> bool:
            done = subprocess.run(
                ["sinfo", "--noheader", "--Node", "--format", "%T"],
                env=env,
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
            return done.stdout.split() == ["idle"] * len(nodes)

        _wait_for(idle, 30, "the nodes to become idle", logs)
        yield cluster
    finally:
        subprocess.run(["scancel", "--full", "--user", "root"], env=env, check=False, timeout=30)
        for process in reversed(started):
            _stop(process.pid)
        shutil.rmtree(root, ignore_errors=True)


def _wait_for(condition: object, timeout: float, what: str, logs: Path) -> None:
    deadline = time.monotonic() + timeout
    assert callable(condition)
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    tails = "\n".join(f"{p.name}: {p.read_text()[-1500:]}" for p in sorted(logs.iterdir()))
    raise AssertionError(f"timed out waiting for {what}\n{tails}")


@pytest.fixture(autouse=True)
def _idle_cluster(request: pytest.FixtureRequest) -> None:
    """Every test that uses the cluster starts with its nodes idle."""
    if "slurm" in request.fixturenames:
        request.getfixturevalue("slurm").settle()
