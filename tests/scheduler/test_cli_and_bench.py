"""The scheduler's command line, `rlslice status`, and the handoff bench (a short run).

Cases: flags, token files, environment and a group-config YAML become SchedulerSettings;
`rlslice scheduler` prints its address, serves, and exits 0 on SIGTERM; `rlslice status
--json` and the table show a live group's holder and queue; the bench measures all three
figures and their ratios in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from rlslice.apps import scheduler as _cmd
from rlslice.apps import status as _cmd_status
from rlslice.apps.bench import handoff
from rlslice.config import Policy


def _parse(module: Any, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    module.configure(parser)
    return parser.parse_args(argv)


def test_flags_env_token_files_and_group_config_become_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "admin").write_text("admin-secret\n")
    (tmp_path / "groups.yaml").write_text(
        "groups:\n  - name: gpus\n    policy: fair\n    max_hold_seconds: 60\n  - name: train\n"
    )
    monkeypatch.setenv("RLSLICE_JOB_TOKEN", "job-secret")
    monkeypatch.setenv("RLSLICE_STORE", str(tmp_path / "s.db"))
    args = _parse(
        _cmd,
        [
            "--address", "127.0.0.1:0",
            "--admin-token-file", str(tmp_path / "admin"),
            "--group-config", str(tmp_path / "groups.yaml"),
            "--metrics-port", "0",
        ],
    )  # fmt: skip
    settings = _cmd.settings_from(args)
    assert settings.address == "127.0.0.1:0"
    assert settings.store == str(tmp_path / "s.db")
    assert (settings.job_token, settings.admin_token, settings.agent_token) == (
        "job-secret",
        "admin-secret",
        None,
    )
    assert [g.name for g in settings.groups] == ["gpus", "train"]
    assert settings.groups[0].policy is Policy.FAIR
    assert settings.metrics_port == 0


async def test_the_scheduler_command_serves_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    command = [sys.executable, "-m", "rlslice.apps", "scheduler", "--address", "127.0.0.1:0"]
    command += ["--store", str(tmp_path / "s.db"), "--auto-create-groups"]
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    assert process.stdout is not None
    line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
    assert re.search(r"listening on 127\.0\.0\.1:\d+", line)
    process.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(process.wait(), 15) == 0
    assert (tmp_path / "s.db").exists()


async def test_status_shows_holder_and_queue(
    start_live: Callable[..., Any], capsys: pytest.CaptureFixture[str]
) -> None:
    async with start_live() as live:
        a = await live.register("a")
        b = await live.register("b")
        await live.acquire("a", a)
        waiting = asyncio.ensure_future(live.acquire("b", b))
        await live.waiting("b")
        args = _parse(_cmd_status, ["g", "--scheduler", live.running.address, "--json"])
        assert await asyncio.to_thread(_cmd_status.run, args) == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown[0]["holder"] == "a"
        assert shown[0]["queue"] == ["b"]
        args = _parse(_cmd_status, ["--scheduler", live.running.address])
        assert await asyncio.to_thread(_cmd_status.run, args) == 0
        table = capsys.readouterr().out
        assert "Held" in table
        assert " a " in table
        args = _parse(_cmd_status, ["nope", "--scheduler", live.running.address])
        assert await asyncio.to_thread(_cmd_status.run, args) == 1
        await live.yield_("a", a)
        await waiting


async def test_the_handoff_bench_measures_everything_in_one_run() -> None:
    args = _parse(
        handoff, ["--iterations", "50", "--handoffs", "20", "--warmup", "8", "--in-process"]
    )
    began = time.time()
    result = await handoff.measure(args)
    left = [
        p.pid
        for p in psutil.process_iter(["cmdline", "create_time"])
        if p.info["cmdline"] == ["sleep", "3600"] and p.info["create_time"] >= began - 1
    ]
    assert left == []  # its jobs' processes are gone, the stopped (parked) one too
    for key in ("bare_roundtrip", "uncontended_acquire", "uncontended_acquire_yield", "handoff"):
        assert result[key]["p99_ms"] >= result[key]["p50_ms"] > 0
    assert result["uncontended_acquire"]["n"] == 50
    assert result["handoff"]["n"] == 20
    # three sim agents (the default), each round after its waiter's prefetch attempt ended
    through = result["handoff_through_agents"]
    assert (through["agents"], through["n"], through["bytes"]) == (3, 5, 0)
    assert through["p99_ms"] >= through["p50_ms"] > 0
    assert result["handoff_p99_ratio"] == pytest.approx(
        result["handoff"]["p99_ms"] / result["bare_roundtrip"]["p99_ms"]
    )
