"""How a client's settings come from its arguments and the environment.

Cases:
- arguments win over environment variables; empty variables count as absent;
- every id is validated at construction, and the message names the field;
- no scheduler means disabled, and then a job id is optional;
- a token comes from the argument, RLSLICE_TOKEN, or RLSLICE_TOKEN_FILE, in that order;
- TLS files come from RLSLICE_TLS_*; a certificate without its key is refused;
- lease seconds come from the argument or RLSLICE_LEASE_SECONDS and are bounded;
- the agent socket is used only when the process is not registered yet;
- a call's group falls back to the default group, and fails naming `group` without one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlslice._errors import InvalidArgumentError
from rlslice._ids import is_valid_id
from rlslice.client._settings import ClientSettings, resolve_settings
from rlslice.config import TLSConfig


def settings(env: dict[str, str] | None = None, **kwargs: Any) -> ClientSettings:
    arguments: dict[str, Any] = {
        "job": None,
        "group": None,
        "scheduler": None,
        "lease_seconds": None,
        "token": None,
        "tls": None,
        "priority": None,
        "weight": None,
        "device_bytes": None,
    }
    arguments.update(kwargs)
    return resolve_settings(env=env or {}, **arguments)


def test_arguments_win_over_the_environment() -> None:
    env = {"RLSLICE_JOB": "env-job", "RLSLICE_GROUP": "env-group", "RLSLICE_SCHEDULER": "h:1"}
    s = settings(env, job="arg-job", group="arg-group", scheduler="127.0.0.1:5")
    assert (s.job, s.group, s.scheduler) == ("arg-job", "arg-group", "127.0.0.1:5")


def test_the_environment_fills_absent_arguments() -> None:
    env = {"RLSLICE_JOB": "env-job", "RLSLICE_GROUP": "env-group", "RLSLICE_SCHEDULER": "h:1"}
    s = settings(env)
    assert (s.job, s.group, s.scheduler, s.enabled) == ("env-job", "env-group", "h:1", True)


def test_empty_environment_variables_count_as_absent() -> None:
    s = settings({"RLSLICE_SCHEDULER": "  ", "RLSLICE_JOB": ""})
    assert s.scheduler is None
    assert not s.enabled
    assert s.job == ""


def test_a_disabled_client_needs_no_job() -> None:
    s = settings()
    assert not s.enabled
    assert s.job == ""


def test_an_enabled_client_needs_a_job() -> None:
    with pytest.raises(InvalidArgumentError, match=r"^job: .*RLSLICE_JOB"):
        settings(scheduler="127.0.0.1:1")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"job": "Bad_Job"}, "job"),
        ({"job": "x" * 64}, "job"),
        ({"job": "-lead"}, "job"),
        ({"job": "ok", "group": "UPPER"}, "group"),
        ({"job": "ok", "group": "a.b"}, "group"),
        ({"job": "ok", "weight": 0}, "weight"),
        ({"job": "ok", "weight": float("nan")}, "weight"),
        ({"job": "ok", "priority": 1.5}, "priority"),
        ({"job": "ok", "lease_seconds": -1}, "lease_seconds"),
        ({"job": "ok", "lease_seconds": 0.5}, "lease_seconds"),
        ({"job": "ok", "lease_seconds": 7200}, "lease_seconds"),
        ({"job": "ok", "lease_seconds": float("inf")}, "lease_seconds"),
        ({"job": "ok", "device_bytes": -1}, "device_bytes"),
        ({"job": "ok", "device_bytes": 1.5}, "device_bytes"),
    ],
)
def test_bad_arguments_are_refused_naming_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgumentError, match=rf"^{field}: "):
        settings(scheduler="127.0.0.1:1", **kwargs)


def test_bad_ids_from_the_environment_are_refused_too() -> None:
    with pytest.raises(InvalidArgumentError, match=r"^group: "):
        settings({"RLSLICE_GROUP": "Not A Label"})


@given(st.text(max_size=70))
def test_any_job_id_is_accepted_exactly_when_it_is_a_label(job: str) -> None:
    if is_valid_id(job):
        assert settings(job=job, scheduler="127.0.0.1:1").job == job
    else:
        with pytest.raises(InvalidArgumentError, match=r"^job: "):
            settings(job=job, scheduler="127.0.0.1:1")


def test_the_token_argument_wins(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    env = {"RLSLICE_TOKEN": "from-env", "RLSLICE_TOKEN_FILE": str(token_file)}
    assert settings(env, token="from-arg").token == "from-arg"
    assert settings(env).token == "from-env"
    assert settings({"RLSLICE_TOKEN_FILE": str(token_file)}).token == "from-file"


def test_an_unreadable_token_file_is_refused_naming_the_variable(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match=r"^RLSLICE_TOKEN_FILE: "):
        settings({"RLSLICE_TOKEN_FILE": str(tmp_path / "missing")})


def test_tls_files_come_from_the_environment() -> None:
    env = {"RLSLICE_TLS_CA": "/ca.pem", "RLSLICE_TLS_CERT": "/c.pem", "RLSLICE_TLS_KEY": "/k.pem"}
    tls = settings(env).tls
    assert tls == TLSConfig(ca=Path("/ca.pem"), cert=Path("/c.pem"), key=Path("/k.pem"))
    assert settings({}).tls is None


def test_a_tls_certificate_without_its_key_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match=r"^RLSLICE_TLS_CERT: "):
        settings({"RLSLICE_TLS_CERT": "/c.pem"})


def test_an_explicit_tls_config_wins_over_the_environment() -> None:
    explicit = TLSConfig(ca=Path("/mine.pem"))
    assert settings({"RLSLICE_TLS_CA": "/ca.pem"}, tls=explicit).tls is explicit


def test_lease_seconds_come_from_the_environment_and_default_to_the_groups() -> None:
    assert settings().lease_seconds == 0.0
    assert settings({"RLSLICE_LEASE_SECONDS": "12.5"}).lease_seconds == 12.5
    with pytest.raises(InvalidArgumentError, match=r"^RLSLICE_LEASE_SECONDS: "):
        settings({"RLSLICE_LEASE_SECONDS": "soon"})


def test_the_agent_socket_is_used_only_while_the_process_is_unregistered() -> None:
    assert settings({"RLSLICE_AGENT_SOCKET": "/run/a.sock"}).agent_socket == "/run/a.sock"
    env = {"RLSLICE_AGENT_SOCKET": "/run/a.sock", "RLSLICE_AGENT_REGISTERED": "1"}
    assert settings(env).agent_socket is None


def test_a_call_falls_back_to_the_default_group() -> None:
    s = settings(job="j", group="default-group", scheduler="127.0.0.1:1")
    assert s.group_or_default(None) == "default-group"
    assert s.group_or_default("other") == "other"


def test_a_call_without_any_group_fails_naming_the_field() -> None:
    s = settings(job="j", scheduler="127.0.0.1:1")
    with pytest.raises(InvalidArgumentError, match=r"^group: .*RLSLICE_GROUP"):
        s.group_or_default(None)
    with pytest.raises(InvalidArgumentError, match=r"^group: "):
        s.group_or_default("Bad Group")
