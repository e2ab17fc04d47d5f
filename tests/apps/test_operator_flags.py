"""`rlslice operator`'s flags are typed as the scheduler's and the agent's.

Cases:
- flags arrive typed (numbers, paths, a role, lists of names) and land in `OperatorConfig`
  and the bootstrap's settings; a zero port turns the webhook off;
- `RLSLICE_OPERATOR_*` variables give typed defaults, and a flag given wins over one;
- flags not given leave the defaults `OperatorConfig` and its parts declare;
- a variable that does not parse (a number, a port, a role) stops the command with one line
  naming it; a role that is not one is a usage error on the command line too.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from rlslice.apps.cli import build_parser
from rlslice.apps.operator import config_from
from rlslice.env import DEFAULT_SCHEDULER_PORT
from rlslice.operator.mutation import SYSTEM_NAMESPACES, InjectionSettings
from rlslice.operator.settings import OperatorConfig, WebhookSettings


@pytest.fixture(autouse=True)
def _no_operator_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("RLSLICE_OPERATOR_"):
            monkeypatch.delenv(name)
    monkeypatch.delenv("RLSLICE_ADMIN_TOKEN", raising=False)


def _args(*argv: str) -> argparse.Namespace:
    return build_parser(only="operator").parse_args(["operator", *argv])


def test_flags_arrive_typed_and_land_in_the_config(tmp_path: Path) -> None:
    token = tmp_path / "admin-token"
    token.write_text("admin-secret\n")
    args = _args(
        "--role",
        "controller",
        "--scheduler",
        "sched:7070",
        "--admin-token-file",
        str(token),
        "--tls-ca",
        str(tmp_path / "ca.crt"),
        "--tls-server-name",
        "rlslice-scheduler",
        "--status-interval",
        "2.5",
        "--delete-timeout",
        "60",
        "--rpc-timeout",
        "0.5",
        "--webhook-port",
        "0",
        "--health-port",
        "0",
        "--skip-namespaces",
        "batch, ci,,",
        "--job-namespaces",
        "rl,rl-eval",
    )
    assert args.status_interval == 2.5
    assert args.health_port == 0
    assert args.tls_ca == tmp_path / "ca.crt"
    assert args.skip_namespaces == ("batch", "ci")
    assert args.job_namespaces == ("rl", "rl-eval")
    config = config_from(args)
    assert config.role == "controller"
    assert config.scheduler_address == "sched:7070"
    assert config.admin_token == "admin-secret"
    assert config.tls is not None
    assert (config.tls.ca, config.tls.cert) == (tmp_path / "ca.crt", None)
    assert config.tls.server_name == "rlslice-scheduler"
    assert (config.status_interval, config.delete_timeout, config.rpc_timeout) == (2.5, 60, 0.5)
    assert config.webhook is None  # port 0: no webhook
    assert config.injection.skip_namespaces == SYSTEM_NAMESPACES | {"batch", "ci"}


def test_variables_give_typed_defaults_and_a_flag_wins(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RLSLICE_OPERATOR_ROLE", "webhook")
    monkeypatch.setenv("RLSLICE_OPERATOR_WEBHOOK_PORT", "9000")
    monkeypatch.setenv("RLSLICE_OPERATOR_WEBHOOK_CERT", str(tmp_path / "tls.crt"))
    monkeypatch.setenv("RLSLICE_OPERATOR_WEBHOOK_KEY", str(tmp_path / "tls.key"))
    monkeypatch.setenv("RLSLICE_OPERATOR_WEBHOOK_NAMES", "rls-webhook,rls-webhook.rl.svc")
    monkeypatch.setenv("RLSLICE_OPERATOR_STATUS_INTERVAL", "3")
    args = _args("--status-interval", "7")
    assert args.webhook_names == ("rls-webhook", "rls-webhook.rl.svc")
    config = config_from(args)
    assert config.role == "webhook"
    assert config.webhook == WebhookSettings(
        port=9000, certfile=tmp_path / "tls.crt", keyfile=tmp_path / "tls.key"
    )
    assert config.status_interval == 7.0  # the flag wins over its variable


def test_flags_not_given_leave_the_configs_own_defaults() -> None:
    args = _args()
    config = config_from(args)
    assert args.health_port == 8080
    assert config.scheduler_address == f"rlslice-scheduler:{DEFAULT_SCHEDULER_PORT}"
    assert config.admin_token is None
    assert config.tls is None
    declared = OperatorConfig(
        scheduler_address="x", injection=InjectionSettings(scheduler_address="x")
    )
    for field in ("status_interval", "delete_timeout", "rpc_timeout", "role"):
        assert getattr(config, field) == getattr(declared, field), field
    assert config.webhook == WebhookSettings()
    injection = config.injection
    assert injection == InjectionSettings(scheduler_address=config.scheduler_address)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("RLSLICE_OPERATOR_STATUS_INTERVAL", "often"),
        ("RLSLICE_OPERATOR_WEBHOOK_PORT", "https"),
        ("RLSLICE_OPERATOR_HEALTH_PORT", "8080.5"),
        ("RLSLICE_OPERATOR_ROLE", "leader"),
    ],
)
def test_a_variable_that_does_not_parse_stops_the_command_naming_it(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit, match=rf"^rlslice: {variable}: "):
        _args()


def test_a_role_that_is_not_one_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        _args("--role", "leader")
    assert stopped.value.code == 2
    assert "--role" in capsys.readouterr().err
