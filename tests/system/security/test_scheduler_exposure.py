"""The scheduler, like the agent, never serves beyond loopback with a role left open.

Cases:
- check_exposure over a table: loopback passes whatever the tokens; a reachable address
  passes only with a token for every role (mutual TLS stands in for the job token, never
  for the admin or agent token: any CA certificate, a job's included, would otherwise get
  those roles), or the explicit opt-in; a refusal
  names the address field and exactly the open roles;
- start_scheduler refuses before binding: the port stays free;
- the real `rlslice scheduler` command exits with a one-line message, and starts on the
  same address once every role has a token.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rlslice import InvalidArgumentError
from rlslice.config import TLSConfig
from rlslice.scheduler import SchedulerSettings, start_scheduler
from rlslice.scheduler.settings import check_exposure
from rlslice.testing import free_port

ALL_TOKENS = {"job_token": "j", "admin_token": "a", "agent_token": "g"}


@pytest.mark.parametrize(
    "fields",
    [
        {"address": "127.0.0.1:0"},
        {"address": "localhost:0"},
        {"address": "[::1]:0"},
        {"address": "0.0.0.0:0", **ALL_TOKENS},
        {"address": "0.0.0.0:0", "allow_unauthenticated": True},
        {
            "address": "[::]:0",
            "tls": TLSConfig(cert="c.pem", key="k.pem", client_ca="ca.pem"),
            "admin_token": "a",
            "agent_token": "g",
        },
    ],
    ids=[
        "ipv4-loopback",
        "localhost",
        "ipv6-loopback",
        "all-tokens",
        "opt-in",
        "mutual-tls-for-jobs",
    ],
)
def test_an_exposure_that_authenticates_every_role_is_accepted(fields: dict[str, object]) -> None:
    check_exposure(SchedulerSettings.model_validate(fields))


@pytest.mark.parametrize(
    ("fields", "open_roles"),
    [
        ({"address": "0.0.0.0:50551"}, "job/admin/agent roles are"),
        ({"address": "10.1.2.3:50551", "job_token": "j"}, "admin/agent roles are"),
        ({"address": "[::]:50551", "job_token": "j", "admin_token": "a"}, "agent role is"),
        (
            {"address": "0.0.0.0:50551", "tls": TLSConfig(cert="c.pem", key="k.pem")},
            "job/admin/agent roles are",
        ),
        (
            {
                "address": "0.0.0.0:50551",
                "tls": TLSConfig(cert="c.pem", key="k.pem", client_ca="ca.pem"),
            },
            "admin/agent roles are",
        ),
        (
            {
                "address": "0.0.0.0:50551",
                "tls": TLSConfig(cert="c.pem", key="k.pem", client_ca="ca.pem"),
                "admin_token": "a",
            },
            "agent role is",
        ),
    ],
    ids=[
        "no-tokens",
        "job-only",
        "agent-open",
        "server-tls-only",
        "mutual-tls-without-role-tokens",
        "mutual-tls-agent-open",
    ],
)
def test_a_reachable_address_with_an_open_role_is_refused_naming_the_roles(
    fields: dict[str, object], open_roles: str
) -> None:
    settings = SchedulerSettings.model_validate(fields)
    with pytest.raises(InvalidArgumentError) as raised:
        check_exposure(settings)
    message = str(raised.value)
    assert message.startswith(f"address: {settings.address} is reachable beyond this host")
    assert f"the {open_roles} open" in message
    assert "\n" not in message


async def test_start_scheduler_refuses_before_binding_the_port() -> None:
    port = free_port()
    with pytest.raises(InvalidArgumentError, match="address"):
        await start_scheduler(SchedulerSettings(address=f"0.0.0.0:{port}"))
    with socket.socket() as probe:  # still free: nothing was bound, not even for a moment
        probe.bind(("0.0.0.0", port))


def _scheduler(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "rlslice.apps", "scheduler", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_the_scheduler_command_refuses_an_open_reachable_port_in_one_line(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLSLICE_")}
    process = _scheduler("--address", f"0.0.0.0:{free_port()}", env=env)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 1
    lines = stderr.strip().splitlines()
    assert lines[-1].startswith("rlslice scheduler: address: 0.0.0.0:")
    assert "--allow-unauthenticated" in lines[-1]

    for role in ("job", "admin", "agent"):
        (tmp_path / role).write_text(f"{role}-token\n")
    tokens = [f"--{role}-token-file={tmp_path / role}" for role in ("job", "admin", "agent")]
    process = _scheduler("--address", "0.0.0.0:0", *tokens, env=env)
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert first.startswith("rlslice scheduler listening on 0.0.0.0:"), first
    finally:
        process.terminate()
        process.communicate(timeout=30)
