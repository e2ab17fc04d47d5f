"""The agent's command-line pieces.

Case matrix:
- sizes: bytes, SI and binary suffixes, bad text refused
- `rlslice agent` flags and RLSLICE_AGENT_* variables become AgentSettings (flags win)
- `rlslice probe --json`: every installed backend, sim usable, a reason for each
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from rlslice.apps import agent as _cmd
from rlslice.apps.cli import main
from rlslice.apps.shared import flags

GiB = 1 << 30


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("1073741824", GiB),
        ("1GiB", GiB),
        ("512MiB", 512 << 20),
        ("2G", 2 * 10**9),
        ("2gb", 2 * 10**9),
        ("1.5GiB", 3 * GiB // 2),
        ("64KiB", 64 << 10),
        ("0", 0),
    ],
)
def test_sizes_read_as_bytes(text: str, size: int) -> None:
    assert flags.size(text) == size


@pytest.mark.parametrize("text", ["", "lots", "1XB", "-1GiB"])
def test_a_size_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        flags.size(text)


def test_agent_flags_and_environment_become_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RLSLICE_AGENT_SCHEDULER", "127.0.0.1:7070")
    monkeypatch.setenv("RLSLICE_AGENT_NODE", "from-env")
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    parser = argparse.ArgumentParser()
    _cmd.configure(parser)
    args = parser.parse_args(
        ["--node", "n7", "--sim-capacity", "8GiB", "--sim-rate-gbps", "12.5",
         "--socket-mode", "666", "--token-file", str(token), "--label", "zone=a",
         "--state-dir", str(tmp_path)]
    )  # fmt: skip
    settings = _cmd.settings_from(args)
    assert settings.node == "n7"
    assert settings.scheduler == "127.0.0.1:7070"
    assert settings.sim.capacity_bytes == 8 * GiB
    assert settings.sim.rate_gbps == 12.5
    assert settings.socket_mode == 0o666
    assert settings.token == "s3cret"
    assert settings.labels == {"zone": "a"}
    assert settings.address == "127.0.0.1:7071"


def test_probe_reports_every_backend_with_a_reason(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["sim"]["usable"] is True
    assert all(entry["detail"] for entry in report.values())
