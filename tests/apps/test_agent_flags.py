"""`rlslice agent`'s flags are typed as the scheduler's: each parses where it is read.

Cases:
- flags and `RLSLICE_AGENT_*` variables arrive typed (sizes, octal bits, paths, numbers)
  and land in `AgentSettings`; a zero (`--host-reserve 0`, `--metrics-port 0`) counts;
- flags not given leave `AgentSettings`' own defaults (the node name, the socket, sim);
- a variable that does not parse stops the command with one line naming it;
- Kubernetes mode's rescan period is typed and checked.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from rlslice import env
from rlslice.apps.agent import kubernetes_from, settings_from
from rlslice.apps.cli import build_parser

GiB = 1 << 30


def _args(*argv: str) -> argparse.Namespace:
    return build_parser(only="agent").parse_args(["agent", *argv])


def test_flags_arrive_typed_and_land_in_the_settings(tmp_path: Path) -> None:
    args = _args(
        "--node",
        "n1",
        "--socket",
        str(tmp_path / "a.sock"),
        "--socket-mode",
        "666",
        "--state-dir",
        str(tmp_path / "state"),
        "--sim-devices",
        "2",
        "--sim-capacity",
        "2GiB",
        "--sim-rate-gbps",
        "0",
        "--host-reserve",
        "0",
        "--host-budget",
        "512MiB",
        "--metrics-port",
        "0",
    )
    assert args.socket_mode == 0o666
    assert args.sim_capacity == 2 * GiB
    settings = settings_from(args)
    assert settings.node == "n1"
    assert settings.socket_path == tmp_path / "a.sock"
    assert settings.socket_mode == 0o666
    assert settings.state_dir == tmp_path / "state"
    assert (settings.sim.devices, settings.sim.capacity_bytes) == (2, 2 * GiB)
    assert settings.sim.rate_gbps == 0.0
    assert settings.host_reserve_bytes == 0
    assert settings.host_budget_bytes == 512 << 20
    assert settings.metrics_port == 0


def test_variables_give_typed_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RLSLICE_AGENT_SIM_ROOT", str(tmp_path / "sim"))
    monkeypatch.setenv("RLSLICE_AGENT_HOST_RESERVE", "0")
    monkeypatch.setenv("RLSLICE_AGENT_SOCKET_MODE", "600")
    settings = settings_from(_args("--node", "n1", "--state-dir", str(tmp_path)))
    assert settings.sim.root == tmp_path / "sim"
    assert settings.host_reserve_bytes == 0
    assert settings.socket_mode == 0o600


def test_flags_not_given_leave_the_settings_defaults(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(env.AGENT_SOCKET, raising=False)
    settings = settings_from(_args("--state-dir", str(tmp_path)))
    assert settings.node == env.default_node_name()
    assert settings.address == "127.0.0.1:7071"
    assert settings.socket_path == env.default_agent_socket(os.environ)
    assert settings.sim.root == Path(env.DEFAULT_SIM_ROOT)
    assert settings.host_budget_bytes is None
    assert settings.metrics_port is None
    assert kubernetes_from(_args()) is None


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("RLSLICE_AGENT_SIM_CAPACITY", "lots"),
        ("RLSLICE_AGENT_SOCKET_MODE", "rw"),
        ("RLSLICE_AGENT_METRICS_PORT", "ninety"),
    ],
)
def test_a_variable_that_does_not_parse_stops_the_command_naming_it(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit, match=rf"^rlslice: {variable}: "):
        _args()


def test_the_kubernetes_rescan_period_is_typed_and_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NODE_NAME", "worker-1")
    kube = kubernetes_from(_args("--kubernetes", "--rescan-seconds", "2.5"))
    assert kube.rescan_seconds == 2.5
    with pytest.raises(ValueError, match=r"rescan-seconds: 0\.0 is outside"):
        kubernetes_from(_args("--kubernetes", "--rescan-seconds", "0"))
