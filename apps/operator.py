"""`rlslice operator`: run the Kubernetes operator (kopf) for TimeSliceGroup resources.

Every flag has an environment variable (the chart sets those), and flags win. Tokens are
read from environment variables or files, never from flags (they would show in `ps`).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from rlslice.apps.shared.flags import env_flag
from rlslice.env import DEFAULT_SCHEDULER_PORT, read_token_file
from rlslice.operator.mutation import SYSTEM_NAMESPACES

_DEFAULTS: dict[str, str] = {
    # The chart's Service name and the scheduler's port (rlslice.env.DEFAULT_SCHEDULER_PORT).
    "scheduler": f"rlslice-scheduler:{DEFAULT_SCHEDULER_PORT}",
    "status_interval": "10",
    "delete_timeout": "300",
    "rpc_timeout": "10",
    "webhook_port": "9443",
    "agent_socket_dir": "/run/rlslice",
    "job_token_key": "token",
    "gpu_toleration_key": "nvidia.com/gpu",
    "health_port": "8080",
    "role": "all",
}


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the operator's flags (defaults from `RLSLICE_OPERATOR_<FLAG>` variables)."""

    def flag(name: str, help_text: str, **extra: Any) -> None:
        dest = name.replace("-", "_")
        variable = f"RLSLICE_OPERATOR_{dest.upper()}"
        env_flag(parser, f"--{name}", variable, help_text, default=_DEFAULTS.get(dest), **extra)

    flag(
        "role",
        "what this process runs: controller (reconciles groups; one replica), webhook "
        "(serves the pod-mutation webhook only; several replicas) or all",
        choices=["all", "controller", "webhook"],
    )
    flag("scheduler", "scheduler address the operator dials (host:port)")
    flag("admin-token-file", "file with the admin token (else RLSLICE_ADMIN_TOKEN)")
    flag("tls-ca", "CA bundle that verifies the scheduler (turns TLS on)")
    flag("tls-cert", "client certificate for mutual TLS")
    flag("tls-key", "client key for mutual TLS")
    flag("tls-server-name", "name to check in the scheduler's certificate")
    flag("status-interval", "seconds between status syncs of each group")
    flag("delete-timeout", "seconds a holder gets to yield before a deletion is forced")
    flag("rpc-timeout", "deadline of each scheduler call, seconds")
    flag("webhook-port", "port of the pod-mutation webhook; 0 turns the webhook off")
    flag("webhook-cert", "PEM certificate of the webhook server")
    flag("webhook-key", "PEM key of the webhook server")
    flag("inject-scheduler", "scheduler address injected into pods (default: --scheduler)")
    flag("agent-socket-dir", "host directory with the agent's Unix socket")
    flag("sim-root", "host folder of the agents' sim backend (default: sim in the socket dir)")
    flag("job-token-secret", "Secret in the pod's namespace holding the job token")
    flag("job-token-key", "key of the job token in that Secret")
    flag("tls-ca-secret", "Secret in the pod's namespace with ca.crt for the scheduler")
    flag("gpu-toleration-key", "taint key of GPU nodes that pods tolerate ('' for none)")
    flag("skip-namespaces", "comma-separated namespaces never mutated (system ones always)")
    flag("health-port", "port of kopf's liveness endpoint (/healthz); 0 turns it off")
    # Created at run time by the controller (GitOps: the chart renders no secret values).
    flag("tokens-secret", "create this tokens Secret when missing and read the admin token")
    flag("job-namespaces", "comma-separated namespaces that get the job-token Secret")
    flag("webhook-tls-secret", "create (and renew) this webhook TLS Secret when missing")
    flag("webhook-names", "comma-separated DNS names the webhook certificate covers")
    flag("webhook-configuration", "MutatingWebhookConfiguration whose caBundle to keep")


def _names(text: str | None) -> tuple[str, ...]:
    return tuple(n.strip() for n in (text or "").split(",") if n.strip())


def _read_token(file: str | None, variable: str) -> str | None:
    if file:
        return read_token_file(Path(file), "--admin-token-file")
    return os.environ.get(variable, "").strip() or None


def run(args: argparse.Namespace) -> int:
    """Run the operator until it is stopped."""
    import asyncio

    import kopf

    from rlslice.operator.handlers import build_registry, login_in_cluster, operator_settings

    config = config_from(args)
    health = int(args.health_port)

    async def main() -> int:
        nonlocal config
        if config.reconciles and (args.tokens_secret or args.webhook_tls_secret):
            tokens = await _bootstrap(args)
            if tokens is None:
                return 1
            if tokens.get("admin-token") and not config.admin_token:
                config = config.model_copy(update={"admin_token": tokens["admin-token"]})
        registry = build_registry(config)
        login_in_cluster(registry)
        await kopf.operator(
            registry=registry,
            settings=operator_settings(config),
            clusterwide=True,
            standalone=True,
            liveness_endpoint=f"http://0.0.0.0:{health}/healthz" if health else None,
        )
        return 0

    return asyncio.run(main())


def config_from(args: argparse.Namespace) -> Any:
    """The `OperatorConfig` the flags describe."""
    from rlslice.config import TLSConfig
    from rlslice.operator.mutation import InjectionSettings
    from rlslice.operator.settings import OperatorConfig, WebhookSettings

    tls = None
    if args.tls_ca or args.tls_cert:
        tls = TLSConfig(
            ca=Path(args.tls_ca) if args.tls_ca else None,
            cert=Path(args.tls_cert) if args.tls_cert else None,
            key=Path(args.tls_key) if args.tls_key else None,
            server_name=args.tls_server_name or None,
        )
    skip = set(SYSTEM_NAMESPACES)
    skip.update(n.strip() for n in (args.skip_namespaces or "").split(",") if n.strip())
    injection = InjectionSettings(
        scheduler_address=args.inject_scheduler or args.scheduler,
        agent_socket_dir=args.agent_socket_dir,
        token_secret=args.job_token_secret or None,
        token_secret_key=args.job_token_key,
        tls_ca_secret=args.tls_ca_secret or None,
        gpu_toleration_key=args.gpu_toleration_key or None,
        skip_namespaces=frozenset(skip),
        sim_root=args.sim_root or None,
    )
    webhook = None
    if int(args.webhook_port):
        webhook = WebhookSettings(
            port=int(args.webhook_port),
            certfile=Path(args.webhook_cert) if args.webhook_cert else None,
            keyfile=Path(args.webhook_key) if args.webhook_key else None,
        )
    admin_token = _read_token(args.admin_token_file, "RLSLICE_ADMIN_TOKEN")
    return OperatorConfig(
        scheduler_address=args.scheduler,
        injection=injection,
        admin_token=admin_token,
        tls=tls,
        status_interval=float(args.status_interval),
        delete_timeout=float(args.delete_timeout),
        rpc_timeout=float(args.rpc_timeout),
        webhook=webhook,
        role=args.role,
    )


async def _bootstrap(args: argparse.Namespace) -> dict[str, str] | None:
    """Create the run-time Secrets (see `rlslice.operator.bootstrap`); None on failure."""
    import datetime
    import sys

    from rlslice.adapters.kube import KubeAPI, KubeError, namespace_in_cluster
    from rlslice.operator.bootstrap import BootstrapSettings, bootstrap

    settings = BootstrapSettings(
        namespace=namespace_in_cluster(),
        tokens_secret=args.tokens_secret or "",
        job_token_secret=args.job_token_secret or "",
        job_namespaces=_names(args.job_namespaces),
        webhook_secret=args.webhook_tls_secret or "",
        webhook_names=_names(args.webhook_names),
        webhook_configuration=args.webhook_configuration or "",
    )
    api = KubeAPI.from_environment()
    try:
        return await bootstrap(api, settings, datetime.datetime.now(datetime.UTC))
    except KubeError as error:
        print(f"rlslice operator: creating its Secrets: {error}", file=sys.stderr)
        return None
    finally:
        await api.close()
