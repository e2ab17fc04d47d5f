"""The README's training loop runs as written against `rlslice scheduler`, and `rlslice up`
serves the same loop; `rlslice status` shows the group afterwards.

Cases:
- two copies of examples/quickstart/train_loop.py against `rlslice scheduler
  --auto-create-groups` both finish, and at least one of them waited for the other;
- the same against `rlslice up` (scheduler + agent in one process, SQLite store);
- `rlslice status --json` lists the group with its epoch raised by every grant.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlslice.testing import free_port

ROOT = Path(__file__).resolve().parents[3]
LOOP = ROOT / "examples" / "quickstart" / "train_loop.py"
ENV = {**os.environ, "PYTHONSAFEPATH": "1"}
CLI = [sys.executable, "-m", "rlslice.apps", "--log-level", "WARNING"]


def _wait_for_port(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert process.poll() is None, "the server exited"
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on {port}")


@pytest.fixture(params=["scheduler", "up"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    if request.param == "scheduler":
        argv = [*CLI, "scheduler", "--address", f"127.0.0.1:{port}", "--auto-create-groups"]
    else:
        argv = [
            *CLI,
            "up",
            "--address",
            f"127.0.0.1:{port}",
            "--store",
            str(tmp_path / "s.db"),
            "--socket",
            str(tmp_path / "agent.sock"),
            "--state-dir",
            str(tmp_path / "agent"),
            "--sim-root",
            str(tmp_path / "sim"),
            "--host-reserve-bytes",
            "0",
        ]
    process = subprocess.Popen(argv, env=ENV, stdout=subprocess.DEVNULL)
    try:
        _wait_for_port(port, process)
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=15)


def test_two_training_loops_take_turns_on_one_group(server: str) -> None:
    loops = [
        subprocess.Popen(
            [sys.executable, str(LOOP), "--job", job, "--scheduler", server, "--steps", "3"],
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for job in ("grpo-a", "grpo-b")
    ]
    outputs = [loop.communicate(timeout=60)[0] for loop in loops]
    assert [loop.returncode for loop in loops] == [0, 0], outputs
    waits = [float(w) for out in outputs for w in re.findall(r"waited (\d+\.\d+) s", out)]
    assert len(waits) == 6
    assert max(waits) > 0.05, "the jobs never waited for each other"

    status = subprocess.run(
        [*CLI, "status", "--scheduler", server, "--json"],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    groups = {g["spec"]["name"]: g for g in json.loads(status.stdout)}
    assert int(groups["gpus-a"]["epoch"]) >= 12  # two jobs x three steps x two phases
