"""`rlslice operator`: run the Kubernetes operator (kopf) for TimeSliceGroup resources.

Every flag has an environment variable, `RLSLICE_OPERATOR_<FLAG>` (upper case, '-' as
'_'; the chart sets those), and flags win. As the scheduler's and the agent's, the flags
are typed (`_FLAGS`, through `rlslice.apps.shared.flags.env_flag`): a number, a path, a
role or a list of names parses where it is read, and a variable that does not parse stops
the command naming it. Tokens are read from environment variables or files, never from
flags (they would show in `ps`).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, get_args

from rlslice.apps.shared.flags import env_flag
from rlslice.env import DEFAULT_SCHEDULER_PORT, read_token_file
from rlslice.operator.mutation import SYSTEM_NAMESPACES
from rlslice.operator.settings import Role

_ROLES: tuple[str, ...] = get_args(Role)


def _variable(flag: str) -> str:
    """`RLSLICE_OPERATOR_<FLAG>`: each flag's variable (a given flag wins)."""
    return "RLSLICE_OPERATOR_" + flag.upper().replace("-", "_")


def _role(text: str) -> str:
    """One of `Role`'s values (`all`, `controller`, `webhook`)."""
    if text not in _ROLES:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(_ROLES)}")
    return text


def _names(text: str) -> tuple[str, ...]:
    """Comma-separated names (`a,b`); blanks between commas are dropped."""
    return tuple(n.strip() for n in text.split(",") if n.strip())


#: (flag, help, env_flag keywords): the operator's flags, in --help order, each typed, each
#: read from `_variable(flag)`.
_FLAGS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    (
        "role",
        "what this process runs: controller (reconciles groups; one replica), webhook "
        "(serves the pod-mutation webhook only; several replicas) or all",
        {"type": _role, "default": "all", "choices": _ROLES},
    ),
    # The chart's Service name and the scheduler's port (rlslice.env.DEFAULT_SCHEDULER_PORT).
    (
        "scheduler",
        "scheduler address the operator dials (host:port)",
        {"default": f"rlslice-scheduler:{DEFAULT_SCHEDULER_PORT}"},
    ),
    (
        "admin-token-file",
        "file with the admin token (else RLSLICE_ADMIN_TOKEN)",
        {"type": Path},
    ),
    ("tls-ca", "CA bundle that verifies the scheduler (turns TLS on)", {"type": Path}),
    ("tls-cert", "client certificate for mutual TLS", {"type": Path}),
    ("tls-key", "client key for mutual TLS", {"type": Path}),
    ("tls-server-name", "name to check in the scheduler's certificate", {}),
    (
        "status-interval",
        "seconds between status syncs of each group",
        {"type": float, "default": 10.0},
    ),
    (
        "delete-timeout",
        "seconds a holder gets to yield before a deletion is forced",
        {"type": float, "default": 300.0},
    ),
    ("rpc-timeout", "deadline of each scheduler call, seconds", {"type": float, "default": 10.0}),
    (
        "webhook-port",
        "port of the pod-mutation webhook; 0 turns the webhook off",
        {"type": int, "default": 9443},
    ),
    ("webhook-cert", "PEM certificate of the webhook server", {"type": Path}),
    ("webhook-key", "PEM key of the webhook server", {"type": Path}),
    ("inject-scheduler", "scheduler address injected into pods (default: --scheduler)", {}),
    (
        "agent-socket-dir",
        "host directory with the agent's Unix socket",
        {"default": "/run/rlslice"},
    ),
    ("sim-root", "host folder of the agents' sim backend (default: sim in the socket dir)", {}),
    ("job-token-secret", "Secret in the pod's namespace holding the job token", {}),
    ("job-token-key", "key of the job token in that Secret", {"default": "token"}),
    ("tls-ca-secret", "Secret in the pod's namespace with ca.crt for the scheduler", {}),
    (
        "gpu-toleration-key",
        "taint key of GPU nodes that pods tolerate ('' for none)",
        {"default": "nvidia.com/gpu"},
    ),
    (
        "skip-namespaces",
        "comma-separated namespaces never mutated (system ones always)",
        {"type": _names},
    ),
    (
        "health-port",
        "port of kopf's liveness endpoint (/healthz); 0 turns it off",
        {"type": int, "default": 8080},
    ),
    # Created at run time by the controller (GitOps: the chart renders no secret values).
    ("tokens-secret", "create this tokens Secret when missing and read the admin token", {}),
    (
        "job-namespaces",
        "comma-separated namespaces that get the job-token Secret",
        {"type": _names},
    ),
    ("webhook-tls-secret", "create (and renew) this webhook TLS Secret when missing", {}),
    (
        "webhook-names",
        "comma-separated DNS names the webhook certificate covers",
        {"type": _names},
    ),
    ("webhook-configuration", "MutatingWebhookConfiguration whose caBundle to keep", {}),
)


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the operator's flags (defaults from `RLSLICE_OPERATOR_<FLAG>` variables)."""
    for flag, text, options in _FLAGS:
        env_flag(parser, f"--{flag}", _variable(flag), text, **options)


def _read_token(file: Path | None, variable: str) -> str | None:
    if file is not None:
        return read_token_file(file, "--admin-token-file")
    return os.environ.get(variable, "").strip() or None


def run(args: argparse.Namespace) -> int:
    """Run the operator until it is stopped."""
    import asyncio

    import kopf

    from rlslice.operator.handlers import build_registry, login_in_cluster, operator_settings

    config = config_from(args)
    health: int = args.health_port

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
    if args.tls_ca is not None or args.tls_cert is not None:
        tls = TLSConfig(
            ca=args.tls_ca,
            cert=args.tls_cert,
            key=args.tls_key,
            server_name=args.tls_server_name or None,
        )
    skip = SYSTEM_NAMESPACES | set(args.skip_namespaces or ())
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
    if args.webhook_port:
        webhook = WebhookSettings(
            port=args.webhook_port, certfile=args.webhook_cert, keyfile=args.webhook_key
        )
    admin_token = _read_token(args.admin_token_file, "RLSLICE_ADMIN_TOKEN")
    return OperatorConfig(
        scheduler_address=args.scheduler,
        injection=injection,
        admin_token=admin_token,
        tls=tls,
        status_interval=args.status_interval,
        delete_timeout=args.delete_timeout,
        rpc_timeout=args.rpc_timeout,
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
        job_namespaces=args.job_namespaces or (),
        webhook_secret=args.webhook_tls_secret or "",
        webhook_names=args.webhook_names or (),
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
