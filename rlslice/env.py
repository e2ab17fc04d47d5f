"""The job-side configuration vocabulary: every shared `RLSLICE_*` name and default, once.

These are the variables a job process reads (the client, `rlslice run`, the `sim` client,
the offload loop) and that launchers set for it (`rlslice run`, the operator's pod
mutation, Slurm scripts, Ray's `runtime_env`). Each is defined here and nowhere else;
tests/kernel/test_env_vocabulary.py fails when a module spells one as a literal instead.

Server commands keep their own prefixed names beside their flags (`RLSLICE_SCHEDULER_*`,
`RLSLICE_AGENT_*`, `RLSLICE_OPERATOR_*`, see `rlslice.apps.shared.flags`), so a variable never
means one thing to a job and another to a server on the same host.

`token_from(env)` and `tls_from(env)` resolve the two settings that take more than one
variable, the same way for the client and for every client-side command.

The rules that turn names into places live here too, so the agent and its jobs compute
them once: `default_node_name()` (the host name as a DNS-1123 label), `default_agent_socket`
(the agent's Unix socket when none is configured) and `agent_socket` (where a job looks
for it), `sim_root` and `sim_node_dir` (the `sim` backend's shared-memory folders).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from rlslice._errors import InvalidArgumentError
from rlslice._ids import validate_id
from rlslice.config import TLSConfig

SCHEDULER = "RLSLICE_SCHEDULER"
"""Scheduler address (`host:port` or `unix:/path`); unset: the client passes calls through."""
JOB = "RLSLICE_JOB"
"""Job id (DNS-1123 label)."""
GROUP = "RLSLICE_GROUP"
"""Default group of a job's phases."""
NODE = "RLSLICE_NODE"
"""Node id, where the host name is not the agent's node name."""
TOKEN = "RLSLICE_TOKEN"
"""Bearer token of the job role."""
TOKEN_FILE = "RLSLICE_TOKEN_FILE"
"""File holding the bearer token (read when `RLSLICE_TOKEN` is unset)."""
LEASE_SECONDS = "RLSLICE_LEASE_SECONDS"
"""Lease asked for at Register; unset: the group's default."""
TLS_CA = "RLSLICE_TLS_CA"
"""PEM CA bundle verifying the scheduler."""
TLS_CERT = "RLSLICE_TLS_CERT"
"""PEM client certificate (mutual TLS); needs `RLSLICE_TLS_KEY`."""
TLS_KEY = "RLSLICE_TLS_KEY"
"""PEM key of `RLSLICE_TLS_CERT`."""
TLS_SERVER_NAME = "RLSLICE_TLS_SERVER_NAME"
"""Overrides the name checked in the scheduler's certificate."""
AGENT_SOCKET = "RLSLICE_AGENT_SOCKET"
"""The node agent's Unix socket, to register this process with."""
AGENT_REGISTERED = "RLSLICE_AGENT_REGISTERED"
"""Set by a launcher that registered the process already: the client does not again."""
RANKS = "RLSLICE_RANKS"
"""`one`: treat this process as a one-rank job whatever `RANK`/`WORLD_SIZE` say (a launcher
such as Slurm sets rank variables for unrelated steps); unset: ranks as detected."""
SIM_ROOT = "RLSLICE_SIM_ROOT"
"""`sim` backend: the shared-memory folder of emulated devices (default `DEFAULT_SIM_ROOT`)."""
SIM_DIR = "RLSLICE_SIM_DIR"
"""`sim` backend: this node's folder, overriding `RLSLICE_SIM_ROOT`/`RLSLICE_NODE`."""

DEFAULT_SCHEDULER = "127.0.0.1:50551"
"""Where client-side commands look for a scheduler, and where `rlslice scheduler` listens."""
DEFAULT_SCHEDULER_PORT = 50551
DEFAULT_SIM_ROOT = "/dev/shm/rlslice-sim"
"""The `sim` backend's shared-memory folder, for the agent and its jobs alike."""


def value(env: Mapping[str, str], name: str) -> str | None:
    """`env[name]` stripped, or None when unset or empty (empty counts as absent)."""
    text = env.get(name, "").strip()
    return text or None


def token_from(env: Mapping[str, str]) -> str | None:
    """The job token: `RLSLICE_TOKEN`, else the contents of `RLSLICE_TOKEN_FILE`, else None.

    Raises `InvalidArgumentError` naming the variable when the file cannot be read.
    """
    if (token := value(env, TOKEN)) is not None:
        return token
    if (path := value(env, TOKEN_FILE)) is not None:
        return read_token_file(Path(path), TOKEN_FILE)
    return None


def read_token_file(path: Path, what: str) -> str | None:
    """A token file's contents, stripped (None when empty); `what` names the flag or variable
    in the one-line error when it cannot be read."""
    try:
        return path.read_text().strip() or None
    except OSError as error:
        raise InvalidArgumentError(f"{what}: cannot read {str(path)!r}: {error.strerror}") from None


def tls_from(env: Mapping[str, str]) -> TLSConfig | None:
    """TLS toward the scheduler from `RLSLICE_TLS_*`, or None (plaintext) when none is set."""
    ca, cert, key = value(env, TLS_CA), value(env, TLS_CERT), value(env, TLS_KEY)
    if ca is None and cert is None and key is None:
        return None
    if (cert is None) != (key is None):
        raise InvalidArgumentError(f"{TLS_CERT}: needs {TLS_KEY} too, and vice versa")
    return TLSConfig(
        ca=Path(ca) if ca else None,
        cert=Path(cert) if cert else None,
        key=Path(key) if key else None,
        server_name=value(env, TLS_SERVER_NAME),
    )


def default_node_name(host: str | None = None) -> str:
    """`host` (default: this host's name) as a DNS-1123 label: its first dot-separated part,
    lower case, other characters replaced by '-', at most 63; `node` when nothing is left.

    The agent's default node name and the node a job's `sim` client attaches to."""
    if host is None:
        host = os.uname().nodename
    name = host.split(".")[0].lower()
    name = re.sub(r"[^a-z0-9-]+", "-", name).strip("-")[:63].strip("-")
    return name or "node"


def default_agent_socket(env: Mapping[str, str]) -> Path:
    """The agent's Unix socket when none is configured: `$XDG_RUNTIME_DIR/rlslice/agent.sock`,
    else `/tmp/rlslice-<uid>/agent.sock`."""
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "rlslice" / "agent.sock"
    return Path("/tmp") / f"rlslice-{os.getuid()}" / "agent.sock"


def agent_socket(env: Mapping[str, str]) -> Path:
    """Where a job finds its node's agent: `RLSLICE_AGENT_SOCKET`, else the agent's default
    (`default_agent_socket`)."""
    configured = env.get(AGENT_SOCKET)
    if configured:
        return Path(configured)
    return default_agent_socket(env)


def sim_root(env: Mapping[str, str]) -> Path:
    """The `sim` backend's shared-memory folder: `RLSLICE_SIM_ROOT`, else `DEFAULT_SIM_ROOT`."""
    return Path(env.get(SIM_ROOT) or DEFAULT_SIM_ROOT)


def sim_node_dir(env: Mapping[str, str], node: str | None = None) -> Path:
    """One node's `sim` folder: `RLSLICE_SIM_DIR`, else `sim_root(env)` joined with `node`,
    `RLSLICE_NODE` or `default_node_name()`, first given wins.

    Raises `InvalidArgumentError` when that node name is not a DNS-1123 label."""
    configured = env.get(SIM_DIR)
    if configured:
        return Path(configured)
    name = node or env.get(NODE) or default_node_name()
    return sim_root(env) / validate_id(name, "node")
