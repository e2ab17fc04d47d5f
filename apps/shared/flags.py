"""The one flags helper of the `rlslice` commands.

- `add_connection_flags(parser)` / `connection_from(args)`: how every client-side command
  (`status`, `top`, `timeline`, `profile`, ...) reaches a scheduler: `--scheduler`, TLS or
  mutual TLS (`--tls-ca`, `--tls-cert`, `--tls-key`) with a server-name override
  (`--tls-server-name`), each defaulting to the job-side variable of `rlslice.env`; the token
  comes from `--token-file`, `RLSLICE_TOKEN` or `RLSLICE_TOKEN_FILE`, never from a flag
  (a command line is visible to every user of the host).
- `size`: an argparse type for byte sizes (`16GiB`, `512MiB`, `2G`, `1073741824`).
- `boolean`: an argparse type for `1/true/yes/on` and `0/false/no/off`.
- `env_flag(parser, flag, variable, help)`: a server command's flag whose default is an
  environment variable (`rlslice scheduler`, `rlslice agent`, `rlslice operator`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlslice import env
from rlslice.config import TLSConfig
from rlslice.units import parse_size


def size(text: str) -> int:
    """Bytes from `1073741824`, `1GiB`, `512MiB`, `2G` (SI: powers of 1000) or `2GiB`.

    The argparse face of `rlslice.units.parse_size`: a bad size is a usage error.
    """
    try:
        return parse_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def boolean(text: str) -> bool:
    """True for `1`, `true`, `yes`, `on`; False for `0`, `false`, `no`, `off`, ``."""
    lowered = text.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean (try true or false)")


@dataclass(frozen=True)
class ConnectionFlags:
    """Where and how a client-side command reaches the scheduler."""

    address: str
    tls: TLSConfig | None
    token: str | None


def add_connection_flags(parser: argparse.ArgumentParser) -> None:
    """`--scheduler`, `--tls-ca/--tls-cert/--tls-key/--tls-server-name`, `--token-file`."""
    group = parser.add_argument_group("connection")
    group.add_argument(
        "--scheduler",
        default=None,
        help=f"scheduler address host:port ({env.SCHEDULER}; default {env.DEFAULT_SCHEDULER})",
    )
    for flag, variable, what in (
        ("--tls-ca", env.TLS_CA, "PEM CA verifying the scheduler (turns TLS on)"),
        ("--tls-cert", env.TLS_CERT, "PEM client certificate, for mutual TLS"),
        ("--tls-key", env.TLS_KEY, "PEM key of --tls-cert"),
    ):
        group.add_argument(flag, type=Path, default=None, help=f"{what} ({variable})")
    group.add_argument(
        "--tls-server-name",
        default=None,
        help=f"name to check in the scheduler's certificate ({env.TLS_SERVER_NAME})",
    )
    group.add_argument(
        "--token-file",
        type=Path,
        default=None,
        help=f"file holding the bearer token (else {env.TOKEN} or {env.TOKEN_FILE})",
    )


def connection_from(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> ConnectionFlags:
    """The connection that `add_connection_flags`' flags and the environment describe.

    A flag wins over its variable. Raises `InvalidArgumentError` naming the flag or variable
    when a token file cannot be read or a client certificate comes without its key.
    """
    source = os.environ if environ is None else environ
    address = args.scheduler or env.value(source, env.SCHEDULER) or env.DEFAULT_SCHEDULER
    token = (
        env.read_token_file(args.token_file, "--token-file")
        if args.token_file is not None
        else env.token_from(source)
    )
    from_env = env.tls_from(source)
    ca = args.tls_ca or (from_env.ca if from_env else None)
    cert = args.tls_cert or (from_env.cert if from_env else None)
    key = args.tls_key or (from_env.key if from_env else None)
    name = args.tls_server_name or (from_env.server_name if from_env else None)
    if (cert is None) != (key is None):
        from rlslice._errors import InvalidArgumentError

        raise InvalidArgumentError("--tls-cert: needs --tls-key too, and vice versa")
    tls = (
        TLSConfig(ca=ca, cert=cert, key=key, server_name=name)
        if ca is not None or cert is not None
        else None
    )
    return ConnectionFlags(address=address, tls=tls, token=token)


def env_flag(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    flag: str,
    variable: str,
    help: str,
    *,
    type: Callable[[str], object] = str,
    default: object = None,
    switch: bool = False,
    **extra: Any,
) -> None:
    """Add `flag`, whose default is the environment variable `variable` when it is set.

    The one way a server command's flag reads the environment: `--help` names the variable,
    a flag given on the command line wins, and a variable that does not parse stops the
    command with one line naming it (exit 2). `switch=True` makes an on/off flag whose
    variable takes `boolean` values; `extra` goes to `add_argument` (`choices=...`).
    """
    raw = os.environ.get(variable, "").strip()
    parse: Callable[[str], object] = boolean if switch else type
    try:
        value = parse(raw) if raw else default
    except (ValueError, argparse.ArgumentTypeError) as error:
        raise SystemExit(f"rlslice: {variable}: {error}") from None
    shown = "" if default in (None, False) else f"; default {default}"
    text = f"{help} ({variable}{shown})"
    if switch:
        parser.add_argument(flag, action="store_true", default=bool(value), help=text, **extra)
    else:
        parser.add_argument(flag, type=type, default=value, help=text, **extra)
