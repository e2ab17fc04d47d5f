"""`rlslice scheduler`: run the scheduler until SIGTERM or SIGINT.

Every flag has an environment variable (shown in --help). Tokens come from files
(`--job-token-file`) or the environment (`RLSLICE_JOB_TOKEN`), never from the command line,
so they do not show in process listings.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


def configure(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add(
        "--address",
        default=_env("RLSLICE_SCHEDULER_ADDRESS", "127.0.0.1:50551"),
        help="listen address host:port (RLSLICE_SCHEDULER_ADDRESS; default %(default)s)",
    )
    add(
        "--store",
        default=_env("RLSLICE_STORE", "memory"),
        help="'memory' or a SQLite file path (RLSLICE_STORE; default %(default)s)",
    )
    add(
        "--metrics-port",
        type=int,
        default=_int(_env("RLSLICE_METRICS_PORT")),
        help="Prometheus port, 0 for any (RLSLICE_METRICS_PORT; default off)",
    )
    add(
        "--metrics-address",
        default=_env("RLSLICE_METRICS_ADDRESS", "127.0.0.1"),
        help="Prometheus bind address (RLSLICE_METRICS_ADDRESS; default %(default)s)",
    )
    for role in ("job", "admin", "agent"):
        add(
            f"--{role}-token-file",
            type=Path,
            help=f"file holding the {role} token (else RLSLICE_{role.upper()}_TOKEN; unset: open)",
        )
    add(
        "--tls-cert",
        type=Path,
        default=_path("RLSLICE_TLS_CERT"),
        help="server certificate (RLSLICE_TLS_CERT)",
    )
    add(
        "--tls-key",
        type=Path,
        default=_path("RLSLICE_TLS_KEY"),
        help="server key (RLSLICE_TLS_KEY)",
    )
    add(
        "--tls-client-ca",
        type=Path,
        default=_path("RLSLICE_TLS_CLIENT_CA"),
        help="CA that client certificates must chain to: mutual TLS (RLSLICE_TLS_CLIENT_CA)",
    )
    add(
        "--agent-tls-ca",
        type=Path,
        default=_path("RLSLICE_AGENT_TLS_CA"),
        help="CA verifying agents (RLSLICE_AGENT_TLS_CA); set to call agents over TLS",
    )
    add(
        "--agent-tls-cert",
        type=Path,
        default=_path("RLSLICE_AGENT_TLS_CERT"),
        help="client certificate for agents (RLSLICE_AGENT_TLS_CERT)",
    )
    add(
        "--agent-tls-key",
        type=Path,
        default=_path("RLSLICE_AGENT_TLS_KEY"),
        help="client key for agents (RLSLICE_AGENT_TLS_KEY)",
    )
    add(
        "--group-config",
        type=Path,
        default=_path("RLSLICE_GROUP_CONFIG"),
        help="YAML file: a list of group specs, or {groups: [...]} (RLSLICE_GROUP_CONFIG)",
    )
    add(
        "--auto-create-groups",
        action="store_true",
        default=_env("RLSLICE_AUTO_CREATE_GROUPS", "") in {"1", "true", "yes"},
        help="create unknown groups on Register (RLSLICE_AUTO_CREATE_GROUPS)",
    )
    add("--shutdown-grace", type=float, default=5.0, help="seconds calls get to finish on SIGTERM")


def _int(value: str | None) -> int | None:
    return int(value) if value else None


def _path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None


def _token(args: argparse.Namespace, role: str) -> str | None:
    path: Path | None = getattr(args, f"{role}_token_file")
    if path is not None:
        return path.read_text().strip() or None
    return os.environ.get(f"RLSLICE_{role.upper()}_TOKEN") or None


def settings_from(args: argparse.Namespace) -> Any:
    """The `SchedulerSettings` the flags describe."""
    import yaml

    from rlslice.config import GroupSpec, TLSConfig
    from rlslice.scheduler.settings import SchedulerSettings

    groups: tuple[GroupSpec, ...] = ()
    if args.group_config is not None:
        data = yaml.safe_load(args.group_config.read_text()) or []
        items = data.get("groups", []) if isinstance(data, dict) else data
        groups = tuple(GroupSpec.model_validate(item) for item in items)
    tls = None
    if args.tls_cert or args.tls_key:
        tls = TLSConfig(cert=args.tls_cert, key=args.tls_key, client_ca=args.tls_client_ca)
    agent_tls = None
    if args.agent_tls_ca or args.agent_tls_cert:
        agent_tls = TLSConfig(
            ca=args.agent_tls_ca, cert=args.agent_tls_cert, key=args.agent_tls_key
        )
    return SchedulerSettings(
        address=args.address,
        store=args.store,
        metrics_port=args.metrics_port,
        metrics_address=args.metrics_address,
        job_token=_token(args, "job"),
        admin_token=_token(args, "admin"),
        agent_token=_token(args, "agent"),
        tls=tls,
        agent_tls=agent_tls,
        auto_create_groups=args.auto_create_groups,
        groups=groups,
        shutdown_grace_seconds=args.shutdown_grace,
    )


def run(args: argparse.Namespace) -> int:
    import asyncio

    settings = settings_from(args)
    asyncio.run(serve(settings))
    return 0


async def serve(settings: Any) -> None:
    """Run until SIGTERM/SIGINT, then stop gracefully."""
    import asyncio
    import logging
    import signal

    from rlslice.scheduler.server import start_scheduler

    # Handlers first: a SIGTERM right after the address is printed must stop us cleanly.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    running = await start_scheduler(settings)
    print(f"rlslice scheduler listening on {running.address}", flush=True)
    if running.metrics_port is not None:
        where = f"{settings.metrics_address}:{running.metrics_port}"
        print(f"metrics on http://{where}/metrics", flush=True)
    await stop.wait()
    logging.getLogger(__name__).info("stopping (grace %.1f s)", settings.shutdown_grace_seconds)
    await running.stop(settings.shutdown_grace_seconds)
