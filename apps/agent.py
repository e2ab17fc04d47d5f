"""`rlslice agent`: run the snapshot agent of this node until SIGTERM / SIGINT.

Every flag can also come from the environment as `RLSLICE_AGENT_<FLAG>` (upper case, '-'
as '_'), e.g. `RLSLICE_AGENT_SCHEDULER=10.0.0.5:7070`; a flag given wins. The Agent
service's certificate flags (`--tls-cert`, `--tls-key`, `--tls-client-ca`) read
`RLSLICE_AGENT_SERVER_TLS_*`. As the scheduler's, the flags are typed (`_FLAGS`, through
`rlslice.apps.shared.flags.env_flag`): a size, a path or a number parses where it is read,
and a variable that does not parse stops the command naming it.

`--kubernetes` (the chart's DaemonSet): see `rlslice.snapshot_agent.kubernetes_mode`.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from rlslice.apps.shared.flags import env_flag, size
from rlslice.env import DEFAULT_SIM_ROOT, read_token_file


def _variable(flag: str) -> str:
    """`RLSLICE_AGENT_<FLAG>`: each flag's variable (a given flag wins)."""
    return "RLSLICE_AGENT_" + _ENV_NAMES.get(flag, flag).upper().replace("-", "_")


def _env(name: str) -> str | None:
    return os.environ.get(_variable(name)) or None


def _octal(text: str) -> int:
    """Permission bits written in octal (`660`)."""
    try:
        return int(text, 8)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not octal (try 660)") from None


# The Agent service's own certificate: RLSLICE_AGENT_SERVER_TLS_*, so that no variable of
# the agent means what a client's (RLSLICE_TLS_*) or the scheduler's means.
_ENV_NAMES = {
    "tls-cert": "server-tls-cert",
    "tls-key": "server-tls-key",
    "tls-client-ca": "server-tls-client-ca",
}

#: (flag, help, env_flag keywords): the agent's flags, in --help order, each typed, each
#: read from `_variable(flag)`. Unset ones (None) leave `AgentSettings`' defaults.
_FLAGS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    (
        "node",
        "node name (default: the host name; in Kubernetes mode NODE_NAME); a name that "
        "is not a DNS-1123 label, such as one with dots, is mapped to one plus a short hash",
        {},
    ),
    ("address", "TCP address of the Agent service", {"default": "127.0.0.1:7071"}),
    ("advertise-address", "address the scheduler dials (default: the bound one)", {}),
    ("socket", "Unix socket for local registration", {"type": Path}),
    ("socket-mode", "permission bits of the socket, octal (default 660)", {"type": _octal}),
    ("state-dir", "directory for job records (survives restarts)", {"type": Path}),
    ("backend", "default backend: sim, cuda, cuda-checkpoint or app (default sim)", {}),
    ("sim-devices", "sim: emulated devices on this node (default 1)", {"type": int}),
    ("sim-capacity", "sim: memory of each emulated device (default 16GiB)", {"type": size}),
    ("sim-rate-gbps", "sim: copy rate in GB/s, 0 for unlimited (default 25)", {"type": float}),
    ("sim-overhead-seconds", "sim: fixed cost per move (default 0)", {"type": float}),
    ("sim-root", f"sim: shared-memory folder (default {DEFAULT_SIM_ROOT})", {"type": Path}),
    ("host-reserve", "host memory kept free when parking (default 1GiB)", {"type": size}),
    (
        "host-budget",
        "most parked state kept in host memory (sim); over it, other parked parts "
        "spill to --spill-dir, least recently parked first (default: no budget)",
        {"type": size},
    ),
    (
        "spill-dir",
        "disk tier: local directory parked parts spill to (default: none)",
        {"type": Path},
    ),
    ("scheduler", "scheduler address to register with (host:port)", {}),
    # The token comes from a file or RLSLICE_AGENT_TOKEN, never from a flag: a command
    # line is visible to every user of the host.
    (
        "token-file",
        "file holding the agent token (else RLSLICE_AGENT_TOKEN, else the node-local "
        "~/.local/state/rlslice/agent-token, created 0600)",
        {"type": Path},
    ),
    ("tls-cert", "PEM certificate of the Agent service", {"type": Path}),
    ("tls-key", "PEM key of the Agent service", {"type": Path}),
    (
        "tls-client-ca",
        "PEM CA that callers' certificates must chain to: mutual TLS",
        {"type": Path},
    ),
    (
        "scheduler-ca",
        "PEM CA that verifies the scheduler (TLS to the scheduler)",
        {"type": Path},
    ),
    (
        "scheduler-cert",
        "PEM client certificate shown to the scheduler (mutual TLS, with --scheduler-key)",
        {"type": Path},
    ),
    ("scheduler-key", "PEM key of --scheduler-cert", {"type": Path}),
    ("metrics-port", "port of the Prometheus endpoint (default: none)", {"type": int}),
)
#: Kubernetes mode's flags, after `--label` and `--kubernetes`.
_KUBERNETES_FLAGS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("proc-root", "Kubernetes mode: the host's /proc (default /proc)", {"type": Path}),
    (
        "rescan-seconds",
        "Kubernetes mode: seconds between process rescans (default 5)",
        {"type": float},
    ),
)


def configure(parser: argparse.ArgumentParser) -> None:
    for flag, text, options in _FLAGS:
        env_flag(parser, f"--{flag}", _variable(flag), text, **options)
    parser.add_argument(
        "--label", action="append", default=[], help="node label key=value, for the scheduler"
    )
    env_flag(
        parser,
        "--kubernetes",
        _variable("kubernetes"),
        "DaemonSet mode: node from NODE_NAME, its labels from the API, jobs from the "
        "pods on it (rlslice.dev/job label) instead of socket registration only",
        switch=True,
    )
    for flag, text, options in _KUBERNETES_FLAGS:
        env_flag(parser, f"--{flag}", _variable(flag), text, **options)
    parser.add_argument(
        "action",
        nargs=argparse.REMAINDER,
        help="`remove NODE [--force]`: take a node's agent out of the scheduler (admin; "
        "see `rlslice agent remove --help`)",
    )


def settings_from(args: argparse.Namespace) -> Any:
    """The AgentSettings the flags describe."""
    from rlslice.snapshot_agent.settings import AgentSettings

    fields = _plain_fields(args)
    fields["sim"] = _sim_settings(args)
    token = read_token_file(args.token_file, "--token-file") if args.token_file else _env("token")
    if token:
        fields["token"] = token
    fields.update(_tls_fields(args))
    fields["labels"] = _labels(args)
    return AgentSettings(**fields)


def _given(args: argparse.Namespace, names: dict[str, str]) -> dict[str, Any]:
    """`{field: value}` for each flag of `names` that was given (or its variable set)."""
    values = {field: getattr(args, flag) for flag, field in names.items()}
    return {field: value for field, value in values.items() if value not in (None, "")}


def _plain_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The settings one flag each sets: names, addresses, sizes, numbers."""
    from rlslice._nodes import node_label

    fields = _given(
        args,
        {
            "address": "address",
            "advertise_address": "advertise_address",
            "socket": "socket_path",
            "socket_mode": "socket_mode",
            "state_dir": "state_dir",
            "backend": "backend",
            "scheduler": "scheduler",
            "spill_dir": "spill_dir",
            "host_reserve": "host_reserve_bytes",
            "host_budget": "host_budget_bytes",
            "metrics_port": "metrics_port",
        },
    )
    if args.kubernetes:
        from rlslice.snapshot_agent.kubernetes_mode import node_name_from_env

        fields["node"] = node_label(args.node or node_name_from_env())
    elif args.node:
        fields["node"] = node_label(args.node)
    return fields


def _sim_settings(args: argparse.Namespace) -> Any:
    """The `sim` backend's settings (`--sim-*`)."""
    from rlslice.snapshot_agent.settings import SimSettings

    sim = _given(
        args,
        {
            "sim_devices": "devices",
            "sim_capacity": "capacity_bytes",
            "sim_rate_gbps": "rate_gbps",
            "sim_overhead_seconds": "overhead_seconds",
            "sim_root": "root",
        },
    )
    return SimSettings(**sim)


def _tls_fields(args: argparse.Namespace) -> dict[str, Any]:
    """TLS of the agent's own endpoint and of its channel to the scheduler."""
    from rlslice.config import TLSConfig

    fields: dict[str, Any] = {}
    if args.tls_cert or args.tls_key:
        fields["tls"] = TLSConfig(
            cert=args.tls_cert, key=args.tls_key, client_ca=args.tls_client_ca or None
        )
    if bool(args.scheduler_cert) != bool(args.scheduler_key):
        raise SystemExit("rlslice agent: --scheduler-cert and --scheduler-key go together")
    if args.scheduler_ca or args.scheduler_cert:
        fields["scheduler_tls"] = TLSConfig(
            ca=args.scheduler_ca or None, cert=args.scheduler_cert, key=args.scheduler_key
        )
    return fields


def _labels(args: argparse.Namespace) -> dict[str, str]:
    """`--label key=value`, repeated."""
    labels = {}
    for item in args.label:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"rlslice agent: --label {item!r} is not key=value")
        labels[key] = value
    return labels


def kubernetes_from(args: argparse.Namespace) -> Any:
    """The `KubernetesSettings` the flags describe, or None outside Kubernetes mode."""
    if not args.kubernetes:
        return None
    from rlslice.snapshot_agent.kubernetes_mode import KubernetesSettings, node_name_from_env

    fields: dict[str, Any] = {"node_name": args.node or node_name_from_env()}
    if args.proc_root:
        fields["proc_root"] = args.proc_root
    if args.rescan_seconds is not None:
        seconds = args.rescan_seconds
        if not 0.1 <= seconds <= 600:
            raise ValueError(f"rescan-seconds: {seconds} is outside [0.1, 600]")
        fields["rescan_seconds"] = seconds
    return KubernetesSettings(**fields)


def run(args: argparse.Namespace) -> int:
    if args.action:
        if args.action[0] != "remove":
            raise SystemExit(f"rlslice agent: unknown action {args.action[0]!r} (try remove)")
        from rlslice.apps import agent_remove

        return agent_remove.run(args.action[1:])
    import asyncio
    import sys

    from pydantic import ValidationError

    from rlslice._errors import RlsliceError
    from rlslice.snapshot_agent.agent import start_agent

    try:
        settings = settings_from(args)
        kube = kubernetes_from(args)
    except (ValidationError, ValueError, OSError) as error:
        print(f"rlslice agent: {error}", file=sys.stderr)
        return 2

    async def main() -> int:
        from rlslice.adapters.kube import KubeError
        from rlslice.adapters.server import serve_until_signal
        from rlslice.snapshot_agent.kubernetes_mode import start_kubernetes_agent

        async def start() -> Any:  # RunningAgent or KubernetesAgent: both stop(grace)
            if kube is not None:
                return await start_kubernetes_agent(settings, kube)
            return await start_agent(settings)

        def serving(running: Any) -> None:
            agent = running.agent if kube is not None else running
            where = ""
            if kube is not None and kube.node != kube.node_name:
                where = f" (Kubernetes node {kube.node_name})"
            print(
                f"rlslice agent: node {agent.node}{where} serving on {agent.address}, "
                f"local socket {agent.socket_path}, backend {settings.backend}",
                flush=True,
            )

        async def stop(running: Any) -> None:
            await running.stop(grace=5.0)

        try:
            await serve_until_signal(start, stop, started=serving)
        except (RlsliceError, RuntimeError, OSError, KubeError) as error:
            print(f"rlslice agent: {error}", file=sys.stderr)
            return 1
        return 0

    return asyncio.run(main())
