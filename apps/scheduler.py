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

if TYPE_CHECKING:
    import asyncio


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
    # Component-prefixed names: RLSLICE_TLS_* belong to the client (its CA and client
    # certificate), so the scheduler's own server certificate lives elsewhere.
    add(
        "--tls-cert",
        type=Path,
        default=_path("RLSLICE_SCHEDULER_TLS_CERT"),
        help="server certificate (RLSLICE_SCHEDULER_TLS_CERT)",
    )
    add(
        "--tls-key",
        type=Path,
        default=_path("RLSLICE_SCHEDULER_TLS_KEY"),
        help="server key (RLSLICE_SCHEDULER_TLS_KEY)",
    )
    add(
        "--tls-client-ca",
        type=Path,
        default=_path("RLSLICE_SCHEDULER_TLS_CLIENT_CA"),
        help="CA that client certificates must chain to: mutual TLS "
        "(RLSLICE_SCHEDULER_TLS_CLIENT_CA)",
    )
    add(
        "--agent-tls-ca",
        type=Path,
        default=_path("RLSLICE_SCHEDULER_AGENT_TLS_CA"),
        help="CA verifying agents (RLSLICE_SCHEDULER_AGENT_TLS_CA); set to call agents over TLS",
    )
    add(
        "--agent-tls-cert",
        type=Path,
        default=_path("RLSLICE_SCHEDULER_AGENT_TLS_CERT"),
        help="client certificate for agents (RLSLICE_SCHEDULER_AGENT_TLS_CERT)",
    )
    add(
        "--agent-tls-key",
        type=Path,
        default=_path("RLSLICE_SCHEDULER_AGENT_TLS_KEY"),
        help="client key for agents (RLSLICE_SCHEDULER_AGENT_TLS_KEY)",
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
    add(
        "--allow-unauthenticated",
        action="store_true",
        default=_env("RLSLICE_ALLOW_UNAUTHENTICATED", "") in {"1", "true", "yes"},
        help="serve beyond loopback with a role open (no token, no mutual TLS): trusted "
        "networks only (RLSLICE_ALLOW_UNAUTHENTICATED)",
    )
    add("--shutdown-grace", type=float, default=5.0, help="seconds calls get to finish on SIGTERM")
    election = parser.add_argument_group("leader election (Kubernetes, several replicas)")
    election.add_argument(
        "--leader-elect",
        action="store_true",
        default=_env("RLSLICE_LEADER_ELECT", "") in {"1", "true", "yes"},
        help="serve only while holding a coordination.k8s.io Lease; the standby answers "
        "health but NOT_SERVING for the Scheduler (RLSLICE_LEADER_ELECT; needs "
        "--store kubernetes)",
    )
    election.add_argument(
        "--lease-name",
        default=_env("RLSLICE_LEASE_NAME", "rlslice-scheduler"),
        help="name of the Lease (RLSLICE_LEASE_NAME; default %(default)s)",
    )
    election.add_argument(
        "--lease-namespace",
        default=_env("RLSLICE_LEASE_NAMESPACE"),
        help="namespace of the Lease (RLSLICE_LEASE_NAMESPACE; default: this pod's)",
    )
    election.add_argument(
        "--lease-duration",
        type=float,
        default=float(_env("RLSLICE_LEASE_DURATION", "15") or 15),
        help="seconds a silent leader keeps the Lease; the standby takes over after it "
        "(RLSLICE_LEASE_DURATION; default %(default)s)",
    )
    election.add_argument(
        "--lease-identity",
        default=_env("RLSLICE_LEASE_IDENTITY") or _env("POD_NAME"),
        help="this replica's name in the Lease (RLSLICE_LEASE_IDENTITY, else POD_NAME, "
        "else the host name)",
    )


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
    import asyncio
    import logging
    import signal

    from rlslice.scheduler.server import start_scheduler

    log = logging.getLogger(__name__)
    # Handlers first: a SIGTERM right after the address is printed must stop us cleanly.
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    if election is not None:
        elected = elected_scheduler(settings, election)
        await elected.start()
        print(
            f"rlslice scheduler listening on {elected.address} as {election.identity}, "
            f"serving while it holds Lease {election.namespace}/{election.name}",
            flush=True,
        )
        await stop.wait()
        log.info("stopping: handing over the Lease")
        # The scheduler stops at once: its state is in the store, and the Lease is
        # released so the standby takes over now rather than after the lease duration.
        await elected.stop(release=True)
        return
    running = await start_scheduler(settings)
    print(f"rlslice scheduler listening on {running.address}", flush=True)
    if running.metrics_port is not None:
        where = f"{settings.metrics_address}:{running.metrics_port}"
        print(f"metrics on http://{where}/metrics", flush=True)
    await stop.wait()
    log.info("stopping (grace %.1f s)", settings.shutdown_grace_seconds)
    await running.stop(settings.shutdown_grace_seconds)
