"""The one flags helper: connection flags, sizes, booleans, and flags read from variables.

Cases:
- `size` reads bytes, SI and IEC units and exponents, and refuses what is not a size;
- `boolean` reads the usual spellings and refuses the rest;
- `env_flag`: the variable gives the default, a flag on the command line wins, a variable
  that does not parse stops the command with one line naming it, a switch reads booleans;
- `connection_from`: flags win over `RLSLICE_*`, the default address is the scheduler's
  default, a client certificate needs its key, the token comes from --token-file or the
  environment (there is no --token flag at all);
- the operator's default scheduler address uses the scheduler's port.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from rlslice import InvalidArgumentError
from rlslice.apps.cli import build_parser
from rlslice.apps.shared.flags import add_connection_flags, boolean, connection_from, env_flag, size
from rlslice.env import DEFAULT_SCHEDULER, DEFAULT_SCHEDULER_PORT


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1073741824", 1 << 30),
        ("1GiB", 1 << 30),
        ("512MiB", 512 << 20),
        ("2G", 2 * 10**9),
        ("1.5Ki", 1536),
        ("1e3", 1000),
        ("64b", 64),
    ],
)
def test_sizes_read_bytes_and_units(text: str, expected: int) -> None:
    assert size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "1 PiB", "-1GiB", "GiB"])
def test_a_non_size_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="is not a size"):
        size(text)


def test_booleans_read_the_usual_spellings_and_refuse_the_rest() -> None:
    assert [boolean(t) for t in ("1", "true", "Yes", "on")] == [True] * 4
    assert [boolean(t) for t in ("0", "false", "NO", "off", "")] == [False] * 5
    with pytest.raises(argparse.ArgumentTypeError, match="is not a boolean"):
        boolean("sometimes")


def _parser(monkeypatch: pytest.MonkeyPatch, **variables: str) -> argparse.ArgumentParser:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    parser = argparse.ArgumentParser()
    env_flag(parser, "--port", "RLSLICE_TEST_PORT", "a port", type=int, default=7)
    env_flag(parser, "--loud", "RLSLICE_TEST_LOUD", "a switch", switch=True)
    return parser


def test_a_variable_gives_the_default_and_a_flag_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _parser(monkeypatch).parse_args([]).port == 7
    parser = _parser(monkeypatch, RLSLICE_TEST_PORT="9", RLSLICE_TEST_LOUD="yes")
    assert vars(parser.parse_args([])) == {"port": 9, "loud": True}
    assert parser.parse_args(["--port", "11"]).port == 11
    assert "RLSLICE_TEST_PORT" in parser.format_help()


def test_a_variable_that_does_not_parse_stops_the_command_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(SystemExit, match=r"^rlslice: RLSLICE_TEST_PORT: "):
        _parser(monkeypatch, RLSLICE_TEST_PORT="nine")
    monkeypatch.delenv("RLSLICE_TEST_PORT")
    with pytest.raises(SystemExit, match=r"^rlslice: RLSLICE_TEST_LOUD: 'maybe' is not a boolean"):
        _parser(monkeypatch, RLSLICE_TEST_LOUD="maybe")


def _connection(argv: list[str], environ: dict[str, str]) -> object:
    parser = argparse.ArgumentParser()
    add_connection_flags(parser)
    return connection_from(parser.parse_args(argv), environ)


def test_connection_flags_win_over_the_environment(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("from-file\n")
    plain = _connection([], {})
    assert (plain.address, plain.tls, plain.token) == (DEFAULT_SCHEDULER, None, None)  # type: ignore[attr-defined]
    environ = {
        "RLSLICE_SCHEDULER": "10.0.0.5:1",
        "RLSLICE_TOKEN": "from-env",
        "RLSLICE_TLS_CA": "/env/ca.pem",
        "RLSLICE_TLS_SERVER_NAME": "env-name",
    }
    from_env = _connection([], environ)
    assert from_env.address == "10.0.0.5:1"  # type: ignore[attr-defined]
    assert from_env.token == "from-env"  # type: ignore[attr-defined]
    assert str(from_env.tls.ca) == "/env/ca.pem"  # type: ignore[attr-defined]
    flags = _connection(
        [
            "--scheduler",
            "127.0.0.2:5",
            "--token-file",
            str(token),
            "--tls-ca",
            "/f/ca.pem",
            "--tls-cert",
            "/f/c.pem",
            "--tls-key",
            "/f/k.pem",
            "--tls-server-name",
            "flag-name",
        ],
        environ,
    )
    assert flags.address == "127.0.0.2:5"  # type: ignore[attr-defined]
    assert flags.token == "from-file"  # type: ignore[attr-defined]
    assert (str(flags.tls.ca), str(flags.tls.cert), flags.tls.server_name) == (  # type: ignore[attr-defined]
        "/f/ca.pem",
        "/f/c.pem",
        "flag-name",
    )


def test_a_client_certificate_needs_its_key_and_there_is_no_token_flag() -> None:
    with pytest.raises(InvalidArgumentError, match=r"^--tls-cert: needs --tls-key"):
        _connection(["--tls-cert", "/c.pem"], {})
    # Not even as an abbreviation of --token-file: the command line takes no token.
    with pytest.raises(SystemExit):
        build_parser(only="status").parse_args(["status", "--token", "secret"])


def test_the_operator_dials_the_schedulers_own_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLSLICE_OPERATOR_SCHEDULER", raising=False)
    args = build_parser(only="operator").parse_args(["operator"])
    assert args.scheduler.endswith(f":{DEFAULT_SCHEDULER_PORT}")
