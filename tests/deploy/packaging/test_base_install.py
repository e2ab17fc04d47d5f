"""A plain `pip install rlslice` (the wheel, no extras, into a fresh virtual environment)
gives a CLI a training job can use, and names the extra any other command needs.

The venv holds only what pip resolves for the base install (grpcio, protobuf, pydantic and
theirs); the scheduler and agent it talks to are a real `rlslice up` from the development
environment, on loopback and a Unix socket in a temporary folder.

Cases:
- the venv really is the base install: no package of any extra is in it;
- `rlslice --help` exits 0 and lists every command; `rlslice --version` is the package's;
- `rlslice run` registers a base-venv Python with the agent and the job's `Client` takes
  two phases from the scheduler;
- `rlslice status --json` shows that group with the epochs those grants raised, and plain
  `rlslice status` prints a table without rich;
- agent, scheduler, up, operator, top and demo exit 2 with the one line naming their
  extras (stderr is that line only).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from rlslice._version import __version__
from rlslice.apps.cli import COMMANDS
from rlslice.testing import free_port

#: distributions of the extras; none may be in the base venv
EXTRA_ONLY = {
    "grpcio-health-checking",
    "grpcio-reflection",
    "prometheus-client",
    "psutil",
    "platformdirs",
    "pyyaml",
    "rich",
    "kopf",
    "kubernetes-asyncio",
    "aiohttp",
    "numpy",
    "matplotlib",
    "cuda-bindings",
    "nvidia-ml-py",
    "opentelemetry-api",
}
JOB = """
from rlslice import Client

with Client() as client:  # job, group and scheduler from `rlslice run`
    for step in range(2):
        with client.phase("train") as grant:
            print("granted", grant.epoch, flush=True)
"""


@pytest.fixture(scope="module")
def base_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed without extras; returns its bin folder."""
    venv = tmp_path_factory.mktemp("base") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=60)
    installed = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr
    return venv / "bin"


def _base(bin_dir: Path, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLSLICE_", "VIRTUAL_ENV"))}
    return subprocess.run(
        [str(bin_dir / "rlslice"), *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**env, "PYTHONSAFEPATH": "1"},
        cwd=bin_dir,
        check=False,
    )


def _wait_ready(target: str, process: subprocess.Popen[bytes]) -> None:
    with grpc.insecure_channel(target) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=30)
        except grpc.FutureTimeoutError:
            pytest.fail(f"{target} did not come up (exit {process.poll()})", pytrace=False)


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """`rlslice up` from the development venv: (scheduler address, agent socket)."""
    tmp = tmp_path_factory.mktemp("up")
    address = f"127.0.0.1:{free_port()}"
    socket_path = tmp / "agent.sock"
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "rlslice.apps", "--log-level", "WARNING", "up"),
            *("--address", address, "--agent-address", f"127.0.0.1:{free_port()}"),
            *("--store", str(tmp / "s.db"), "--socket", str(socket_path)),
            *("--state-dir", str(tmp / "agent"), "--sim-root", str(tmp / "sim")),
            *("--host-reserve-bytes", "0"),
        ],
        env={**os.environ, "PYTHONSAFEPATH": "1"},
        stdout=subprocess.DEVNULL,
    )
    try:
        _wait_ready(address, process)
        _wait_ready(f"unix:{socket_path}", process)
        yield address, socket_path
    finally:
        process.terminate()
        process.wait(timeout=15)


def test_the_fresh_venv_holds_the_base_install_and_no_extra(base_venv: Path) -> None:
    listed = subprocess.run(
        [str(base_venv / "python"), "-m", "pip", "list", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    names = {p["name"].lower().replace("_", "-") for p in json.loads(listed.stdout)}
    assert {"rlslice", "grpcio", "protobuf", "pydantic"} <= names
    assert not names & EXTRA_ONLY


def test_help_lists_every_command_and_version_is_the_packages(base_venv: Path) -> None:
    helped = _base(base_venv, "--help")
    assert helped.returncode == 0, helped.stderr
    for name in COMMANDS:
        assert f"    {name} " in helped.stdout
    versioned = _base(base_venv, "--version")
    assert versioned.stdout.strip() == f"rlslice {__version__}"


def test_run_registers_the_job_and_its_client_takes_turns(
    base_venv: Path, standalone: tuple[str, Path]
) -> None:
    address, socket_path = standalone
    ran = _base(
        base_venv,
        "run",
        "--job",
        "base-job",
        "--group",
        "base-group",
        "--agent-socket",
        str(socket_path),
        "--scheduler",
        address,
        "--",
        str(base_venv / "python"),
        "-c",
        JOB,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.count("granted") == 2

    status = _base(base_venv, "status", "--scheduler", address, "--json")
    assert status.returncode == 0, status.stderr
    groups = {g["spec"]["name"]: g for g in json.loads(status.stdout)}
    assert int(groups["base-group"]["epoch"]) >= 2

    table = _base(base_venv, "status", "--scheduler", address)
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.splitlines()
    assert header.split()[:3] == ["group", "phase", "holder"]
    assert any(row.startswith("base-group ") for row in rows)


@pytest.mark.parametrize(
    ("argv", "extras"),
    [
        (["agent"], "agent"),
        (["scheduler"], "scheduler"),
        (["up"], "scheduler,agent"),
        (["operator"], "operator"),
        (["top", "--once"], "console"),
        (["demo"], "scheduler,agent,planner,console"),
    ],
)
def test_a_command_without_its_extra_exits_2_naming_it(
    base_venv: Path, argv: list[str], extras: str
) -> None:
    result = _base(base_venv, "--log-level", "ERROR", *argv)
    assert result.returncode == 2
    line = result.stderr.strip()
    assert "\n" not in line, result.stderr
    assert line.startswith(f"rlslice {argv[0]} needs the ")
    assert line.endswith(f": pip install 'rlslice[{extras}]'")
