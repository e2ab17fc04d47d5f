"""The systemd units of deploy/systemd/ verify, stay sandboxed, and say what the commands
understand.

Cases:
- `systemd-analyze verify` accepts both units with no warning (ExecStart pointed at this
  checkout's `rlslice`, since verify checks that the binary exists);
- `systemd-analyze security --offline` rates the scheduler's exposure at most 2.0 and the
  agent's at most 5.0 (of 10);
- the scheduler keeps no capability; the agent exactly CAP_KILL and CAP_SYS_PTRACE, with
  its socket in RuntimeDirectory and its records in StateDirectory;
- each ExecStart parses with the command's own argument parser;
- every variable the environment files set (commented ones included) is one the command
  reads, and the token variables are there, empty, for the operator to fill.

Needs `systemd-analyze` (Debian's `systemd`; `.ci/run` installs it): skipped without it,
failed under `CI=true`.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlslice.apps.cli import build_parser

ROOT = Path(__file__).resolve().parents[3]
UNITS = ROOT / "deploy" / "systemd"
INSTALLED = "/opt/rlslice/bin/rlslice"
RLSLICE = Path(sys.executable).with_name("rlslice")


@pytest.fixture(scope="module")
def analyze() -> str:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true and systemd-analyze is missing (.ci/run installs systemd)")
        pytest.skip("systemd-analyze not installed (apt-get install systemd)")
    return tool


@pytest.fixture(scope="module")
def units(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("units")
    found = {}
    for unit in sorted(UNITS.glob("*.service")):
        text = unit.read_text()
        assert INSTALLED in text, f"{unit.name}: ExecStart is not {INSTALLED}"
        (folder / unit.name).write_text(text.replace(INSTALLED, str(RLSLICE)))
        found[unit.stem] = folder / unit.name
    assert set(found) == {"rlslice-scheduler", "rlslice-agent"}
    return found


def _settings(unit: Path) -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for line in unit.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            values.setdefault(key.strip(), []).append(value.strip())
    return values


def test_both_units_verify_without_a_warning(analyze: str, units: dict[str, Path]) -> None:
    done = subprocess.run(
        [analyze, "verify", *map(str, units.values())],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    ours = [line for line in done.stderr.splitlines() if "rlslice" in line]
    assert not ours, "\n".join(ours)


@pytest.mark.parametrize(("name", "most"), [("rlslice-scheduler", 2.0), ("rlslice-agent", 5.0)])
def test_the_units_are_sandboxed(
    analyze: str, units: dict[str, Path], name: str, most: float
) -> None:
    done = subprocess.run(
        [analyze, "security", "--offline=true", str(units[name])],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", done.stdout)
    assert match, done.stdout + done.stderr
    assert float(match.group(1)) <= most, done.stdout


def test_the_agent_keeps_two_capabilities_and_the_scheduler_none(
    units: dict[str, Path],
) -> None:
    agent = _settings(units["rlslice-agent"])
    assert agent["CapabilityBoundingSet"] == ["CAP_KILL CAP_SYS_PTRACE"]
    assert agent["AmbientCapabilities"] == [""]
    assert agent["NoNewPrivileges"] == ["yes"]
    assert agent["RuntimeDirectory"] == ["rlslice"]
    assert agent["StateDirectory"] == ["rlslice/agent"]
    assert "${RUNTIME_DIRECTORY}/agent.sock" in agent["ExecStart"][0]
    assert "${STATE_DIRECTORY}" in agent["ExecStart"][0]
    scheduler = _settings(units["rlslice-scheduler"])
    assert scheduler["CapabilityBoundingSet"] == [""]
    assert scheduler["DynamicUser"] == ["yes"]
    assert scheduler["StateDirectory"] == ["rlslice/scheduler"]


@pytest.mark.parametrize("name", ["rlslice-scheduler", "rlslice-agent"])
def test_each_exec_start_parses_with_its_command(units: dict[str, Path], name: str) -> None:
    (line,) = _settings(units[name])["ExecStart"]
    argv = shlex.split(line.replace("${RUNTIME_DIRECTORY}", "/run/rlslice"))
    argv = [a.replace("${STATE_DIRECTORY}", "/var/lib/x") for a in argv]
    assert argv[0] == str(RLSLICE)
    assert RLSLICE.exists()
    command = argv[1]
    args = build_parser(only=command).parse_args(argv[1:])
    assert args.command == command


def _variables(env_file: Path) -> dict[str, str]:
    found = {}
    for line in env_file.read_text().splitlines():
        match = re.match(r"^#?(RLSLICE_[A-Z0-9_]+)=(.*)$", line)
        if match:
            found[match.group(1)] = match.group(2)
    return found


def test_the_environment_files_set_only_what_the_commands_read() -> None:
    scheduler = _variables(UNITS / "scheduler.env")
    source = (ROOT / "apps" / "scheduler.py").read_text()
    for name in scheduler:
        if name.endswith("_TOKEN"):
            role = name.removeprefix("RLSLICE_").removesuffix("_TOKEN").lower()
            assert role in {"job", "admin", "agent"}, name
        else:
            assert f'"{name}"' in source, f"apps/scheduler.py reads no {name}"
    for role in ("JOB", "ADMIN", "AGENT"):
        assert scheduler[f"RLSLICE_{role}_TOKEN"] == ""

    agent = _variables(UNITS / "agent.env")
    flags = {
        action.dest
        for action in build_parser(only="agent")
        ._subparsers._group_actions[0]  # type: ignore[union-attr]
        .choices["agent"]
        ._actions
    }
    server_tls = {"server_tls_cert": "tls_cert", "server_tls_key": "tls_key"}
    agent_source = (ROOT / "apps" / "agent.py").read_text()
    for name in agent:
        if name == "RLSLICE_AGENT_TOKEN":  # read from the environment only, never a flag
            assert "RLSLICE_AGENT_TOKEN" in agent_source
            continue
        flag = name.removeprefix("RLSLICE_AGENT_").lower()
        assert server_tls.get(flag, flag) in flags, f"rlslice agent has no flag for {name}"
    assert agent["RLSLICE_AGENT_TOKEN"] == ""
