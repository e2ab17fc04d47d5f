"""`rlslice scheduler`: run the scheduler until SIGTERM or SIGINT.

Every flag has an environment variable (shown in --help). Tokens come from files
(`--job-token-file`) or the environment (`RLSLICE_JOB_TOKEN`), never from the command line,
so they do not show in process listings.

`--leader-elect` (Kubernetes, several replicas): the replica holding the coordination.k8s.io
Lease serves; the others keep the port with a health service that says NOT_SERVING for the
Scheduler, so their readiness fails and the Service routes no job to them
(`rlslice.scheduler.leader`).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlslice.apps.shared.flags import env_flag
from rlslice.env import DEFAULT_SCHEDULER

if TYPE_CHECKING:
    import asyncio


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


#: (flag, variable, help, env_flag keywords): the scheduler's flags, in --help order.
# Component-prefixed names for TLS: RLSLICE_TLS_* belong to the client (its CA and client
# certificate), so the scheduler's own server certificate lives elsewhere.
_FLAGS: tuple[tuple[str, str, str, dict[str, Any]], ...] = (
    (
        "--address",
        "RLSLICE_SCHEDULER_ADDRESS",
        "listen address host:port",
        {"default": DEFAULT_SCHEDULER},
    ),
    ("--store", "RLSLICE_STORE", "'memory' or a SQLite file path", {"default": "memory"}),
    (
        "--metrics-port",
        "RLSLICE_METRICS_PORT",
        "Prometheus port, 0 for any (unset: off)",
        {"type": int},
    ),
    (
        "--metrics-address",
        "RLSLICE_METRICS_ADDRESS",
        "Prometheus bind address",
        {"default": "127.0.0.1"},
    ),
    ("--tls-cert", "RLSLICE_SCHEDULER_TLS_CERT", "server certificate", {"type": Path}),
    ("--tls-key", "RLSLICE_SCHEDULER_TLS_KEY", "server key", {"type": Path}),
    (
        "--tls-client-ca",
        "RLSLICE_SCHEDULER_TLS_CLIENT_CA",
        "CA that client certificates must chain to: mutual TLS",
        {"type": Path},
    ),
    (
        "--agent-tls-ca",
        "RLSLICE_SCHEDULER_AGENT_TLS_CA",
        "CA verifying agents; set to call agents over TLS",
        {"type": Path},
    ),
    (
        "--agent-tls-cert",
        "RLSLICE_SCHEDULER_AGENT_TLS_CERT",
        "client certificate for agents",
        {"type": Path},
    ),
    ("--agent-tls-key", "RLSLICE_SCHEDULER_AGENT_TLS_KEY", "client key for agents", {"type": Path}),
    (
        "--group-config",
        "RLSLICE_GROUP_CONFIG",
        "YAML file: a list of group specs, or {groups: [...]}",
        {"type": Path},
    ),
    (
        "--auto-create-groups",
        "RLSLICE_AUTO_CREATE_GROUPS",
        "create unknown groups on Register",
        {"switch": True},
    ),
    (
        "--max-jobs-per-group",
        "RLSLICE_MAX_JOBS_PER_GROUP",
        "jobs one group may have; a Register beyond is refused RESOURCE_EXHAUSTED",
        {"type": int, "default": 256},
    ),
    (
        "--max-groups",
        "RLSLICE_MAX_GROUPS",
        "groups --auto-create-groups may create up to; beyond, Register is refused",
        {"type": int, "default": 1024},
    ),
    (
        "--allow-unauthenticated",
        "RLSLICE_ALLOW_UNAUTHENTICATED",
        "serve beyond loopback with a role open (no token, no mutual TLS): trusted networks only",
        {"switch": True},
    ),
)
_ELECTION_FLAGS: tuple[tuple[str, str, str, dict[str, Any]], ...] = (
    (
        "--leader-elect",
        "RLSLICE_LEADER_ELECT",
        "serve only while holding a coordination.k8s.io Lease; the standby answers health but NOT_SERVING for the Scheduler (needs --store kubernetes)",
        {"switch": True},
    ),
    ("--lease-name", "RLSLICE_LEASE_NAME", "name of the Lease", {"default": "rlslice-scheduler"}),
    (
        "--lease-namespace",
        "RLSLICE_LEASE_NAMESPACE",
        "namespace of the Lease (unset: this pod's)",
        {},
    ),
    (
        "--lease-duration",
        "RLSLICE_LEASE_DURATION",
        "seconds a silent leader keeps the Lease; the standby takes over after it",
        {"type": float, "default": 15.0},
    ),
)


def configure(parser: argparse.ArgumentParser) -> None:
    for flag, variable, text, options in _FLAGS:
        env_flag(parser, flag, variable, text, **options)
    for role in ("job", "admin", "agent"):
        parser.add_argument(
            f"--{role}-token-file",
            type=Path,
            help=f"file holding the {role} token (else RLSLICE_{role.upper()}_TOKEN; unset: open)",
        )
    parser.add_argument(
        "--shutdown-grace", type=float, default=5.0, help="seconds calls get to finish on SIGTERM"
    )
    election = parser.add_argument_group("leader election (Kubernetes, several replicas)")
    for flag, variable, text, options in _ELECTION_FLAGS:
        env_flag(election, flag, variable, text, **options)
    election.add_argument(
        "--lease-identity",
        default=_env("RLSLICE_LEASE_IDENTITY") or _env("POD_NAME"),
        help="this replica's name in the Lease (RLSLICE_LEASE_IDENTITY, else POD_NAME, "
        "else the host name)",
    )


def _token(args: argparse.Namespace, role: str) -> str | None:
    path: Path | None = getattr(args, f"{role}_token_file")
    if path is not None:
        return path.read_text().strip() or None
    return os.environ.get(f"RLSLICE_{role.upper()}_TOKEN") or None


def settings_from(args: argparse.Namespace) -> Any:
    """The `SchedulerSettings` the flags describe."""
    from rlslice.config import GroupSpec, TLSConfig, load_group_config
    from rlslice.scheduler.settings import SchedulerSettings

    groups: tuple[GroupSpec, ...] = ()
    if args.group_config is not None:
        groups = load_group_config(args.group_config)
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
        max_jobs_per_group=args.max_jobs_per_group,
        max_groups=args.max_groups,
        allow_unauthenticated=args.allow_unauthenticated,
        groups=groups,
        shutdown_grace_seconds=args.shutdown_grace,
    )


@dataclass(frozen=True)
class Election:
    """Where and as whom `rlslice scheduler --leader-elect` campaigns."""

    namespace: str
    name: str
    identity: str
    duration: float = 15.0
    retry_period: float = 2.0


def election_from(args: argparse.Namespace) -> Election | None:
    """The election the flags ask for, or None without `--leader-elect`."""
    if not args.leader_elect:
        return None
    import socket

    from rlslice._ids import validate_id
    from rlslice.adapters.kube import namespace_in_cluster

    store = str(args.store)
    if store != "kubernetes" and not store.startswith("kubernetes:"):
        # A new leader must find the old one's state: only the cluster store is shared.
        raise SystemExit(
            f"rlslice scheduler: --leader-elect needs --store kubernetes (got {store!r}): "
            "a replica that takes over must load the state the leader kept"
        )
    if not 3 <= args.lease_duration <= 300:
        raise SystemExit("rlslice scheduler: --lease-duration must be within [3, 300] seconds")
    try:
        validate_id(args.lease_name, "--lease-name")
    except ValueError as error:
        raise SystemExit(f"rlslice scheduler: {error}") from None
    return Election(
        namespace=args.lease_namespace or namespace_in_cluster(),
        name=args.lease_name,
        identity=args.lease_identity or socket.gethostname(),
        duration=args.lease_duration,
        # Renew three times per renew deadline (2/3 of the lease), as client-go does.
        retry_period=max(0.1, args.lease_duration / 7.5),
    )


def elected_scheduler(settings: Any, election: Election) -> Any:
    """An `ElectedScheduler` campaigning for `election`'s Lease through the in-cluster API."""
    from rlslice.adapters.kube import KubeAPI
    from rlslice.scheduler.leader import ElectedScheduler, LeaseElector

    elector = LeaseElector(
        KubeAPI.from_environment(),
        election.namespace,
        election.name,
        election.identity,
        duration=election.duration,
        retry_period=election.retry_period,
    )
    # The leader labels its own pod (POD_NAME, the downward API): the Service selects it.
    return ElectedScheduler(settings, elector, pod=os.environ.get("POD_NAME") or None)


def run(args: argparse.Namespace) -> int:
    import asyncio

    from rlslice._errors import InvalidArgumentError
    from rlslice.scheduler.settings import check_exposure

    settings = settings_from(args)
    try:
        check_exposure(settings)  # before campaigning: a standby binds the port too
    except InvalidArgumentError as error:
        raise SystemExit(f"rlslice scheduler: {error}") from None
    election = election_from(args)
    asyncio.run(serve(settings, election))
    return 0


async def serve(
    settings: Any, election: Election | None = None, stop: asyncio.Event | None = None
) -> None:
    """Run until SIGTERM/SIGINT (or `stop` is set), then stop gracefully."""
    import logging

    from rlslice.adapters.server import serve_until_signal
    from rlslice.scheduler.server import start_scheduler

    log = logging.getLogger(__name__)
    if election is not None:
        elected = elected_scheduler(settings, election)

        async def start_elected() -> Any:
            await elected.start()
            return elected

        def campaigning(_: Any) -> None:
            print(
                f"rlslice scheduler listening on {elected.address} as {election.identity}, "
                f"serving while it holds Lease {election.namespace}/{election.name}",
                flush=True,
            )

        async def hand_over(_: Any) -> None:
            log.info("stopping: handing over the Lease")
            # The scheduler stops at once: its state is in the store, and the Lease is
            # released so the standby takes over now rather than after the lease duration.
            await elected.stop(release=True)

        await serve_until_signal(start_elected, hand_over, started=campaigning, until=stop)
        return

    def listening(running: Any) -> None:
        print(f"rlslice scheduler listening on {running.address}", flush=True)
        if running.metrics_port is not None:
            where = f"{settings.metrics_address}:{running.metrics_port}"
            print(f"metrics on http://{where}/metrics", flush=True)

    async def stop_gracefully(running: Any) -> None:
        log.info("stopping (grace %.1f s)", settings.shutdown_grace_seconds)
        await running.stop(settings.shutdown_grace_seconds)

    await serve_until_signal(
        lambda: start_scheduler(settings), stop_gracefully, started=listening, until=stop
    )
