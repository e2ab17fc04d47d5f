"""Secrets the operator creates at run time, so the chart renders the same manifests every
time (GitOps: Argo CD and Flux run `helm template`; a `lookup` + random value there would
rotate tokens and the webhook CA under running jobs at every sync).

At the controller's start, before any handler runs:

1. the tokens Secret (`job-token`, `admin-token`, `agent-token`) in the release namespace:
   created with random tokens when missing, keys added when missing, never changed
   otherwise (the scheduler and the agents read it; pods wait for it to exist);
2. the job token copied into the Secret of each job namespace (a pod reads Secrets of its
   own namespace only), updated when it differs;
3. the webhook's serving certificate: a Secret of type kubernetes.io/tls with `ca.crt`,
   created (or replaced when it misses a name or ends within 30 days) from a private CA;
   the CA is then written into the MutatingWebhookConfiguration's `caBundle`.

Each step is skipped when its setting is empty (an existing Secret or cert-manager
provides it). Creation races resolve on the API server: a 409 means someone else created
the object first, and theirs is read back.
"""

from __future__ import annotations

import base64
import datetime
import logging
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rlslice.adapters.kube import KubeAPI, KubeError
from rlslice.operator.certificates import make_serving_certificate, needs_renewal

log = logging.getLogger(__name__)

TOKEN_KEYS = ("job-token", "admin-token", "agent-token")
LABELS = {"app.kubernetes.io/name": "rlslice", "app.kubernetes.io/managed-by": "rlslice-operator"}


@dataclass(frozen=True)
class BootstrapSettings:
    """What the operator creates at start; an empty name skips that step."""

    namespace: str
    """The release namespace (tokens Secret, webhook Secret)."""
    tokens_secret: str = ""
    """Name of the tokens Secret to create when missing."""
    job_token_secret: str = ""
    """Name of the job-token Secret (key `token`) kept in each of `job_namespaces`."""
    job_namespaces: tuple[str, ...] = ()
    """Namespaces whose pods join groups and read the job token."""
    webhook_secret: str = ""
    """Name of the webhook's TLS Secret to create (and renew) when missing."""
    webhook_names: tuple[str, ...] = ()
    """DNS names of the webhook Service the certificate covers."""
    webhook_configuration: str = ""
    """MutatingWebhookConfiguration whose caBundle follows the generated CA."""
    labels: Mapping[str, str] = field(default_factory=lambda: dict(LABELS))
    """Labels of the objects created."""


def _b64(data: bytes | str) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode()


def _decoded(secret: Mapping[str, Any]) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}


def _secret_path(namespace: str, name: str = "") -> str:
    base = f"/api/v1/namespaces/{namespace}/secrets"
    return f"{base}/{name}" if name else base


async def _get(api: KubeAPI, path: str) -> dict[str, Any] | None:
    try:
        return await api.request("GET", path)
    except KubeError as error:
        if error.status == 404:
            return None
        raise


async def _create_or_read(
    api: KubeAPI, namespace: str, name: str, body: dict[str, Any]
) -> dict[str, Any]:
    try:
        return await api.request("POST", _secret_path(namespace), body)
    except KubeError as error:
        if error.status != 409:
            raise
    found = await _get(api, _secret_path(namespace, name))
    if found is None:
        raise KubeError(409, f"secret {namespace}/{name}: created and gone again")
    return found


def _secret(
    settings: BootstrapSettings,
    namespace: str,
    name: str,
    data: Mapping[str, str],
    kind: str = "Opaque",
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(settings.labels)},
        "type": kind,
        "data": {k: _b64(v) for k, v in data.items()},
    }


async def ensure_tokens(
    api: KubeAPI,
    settings: BootstrapSettings,
    *,
    generate: Callable[[], str] = lambda: secrets.token_urlsafe(36),
) -> dict[str, str]:
    """The tokens Secret's values, created (or completed) with `generate`d tokens."""
    namespace, name = settings.namespace, settings.tokens_secret
    found = await _get(api, _secret_path(namespace, name))
    if found is None:
        body = _secret(settings, namespace, name, {key: generate() for key in TOKEN_KEYS})
        found = await _create_or_read(api, namespace, name, body)
        log.info("created the tokens Secret %s/%s", namespace, name)
    tokens = _decoded(found)
    missing = {key: generate() for key in TOKEN_KEYS if not tokens.get(key)}
    if missing:
        patch = {"data": {k: _b64(v) for k, v in missing.items()}}
        await api.request(
            "PATCH",
            _secret_path(namespace, name),
            patch,
            content_type="application/merge-patch+json",
        )
        tokens.update(missing)
    return tokens


async def ensure_job_tokens(api: KubeAPI, settings: BootstrapSettings, token: str) -> None:
    """The job token in the Secret of every job namespace."""
    name = settings.job_token_secret
    for namespace in settings.job_namespaces:
        found = await _get(api, _secret_path(namespace, name))
        if found is None:
            found = await _create_or_read(
                api, namespace, name, _secret(settings, namespace, name, {"token": token})
            )
        if _decoded(found).get("token") != token:
            await api.request(
                "PATCH",
                _secret_path(namespace, name),
                {"data": {"token": _b64(token)}},
                content_type="application/merge-patch+json",
            )


async def ensure_webhook_certificate(
    api: KubeAPI, settings: BootstrapSettings, now: datetime.datetime
) -> bytes:
    """The CA (PEM) of a valid webhook serving certificate in the webhook Secret."""
    namespace, name, names = settings.namespace, settings.webhook_secret, settings.webhook_names
    path = _secret_path(namespace, name)
    found = await _get(api, path)
    if found is not None:
        data = _decoded(found)
        if data.get("ca.crt") and not needs_renewal(data.get("tls.crt", "").encode(), names, now):
            return data["ca.crt"].encode()
    made = make_serving_certificate(names, now)
    data = {"ca.crt": made.ca.decode(), "tls.crt": made.cert.decode(), "tls.key": made.key.decode()}
    body = _secret(settings, namespace, name, data, kind="kubernetes.io/tls")
    if found is None:
        found = await _create_or_read(api, namespace, name, body)
        log.info("created the webhook certificate Secret %s/%s", namespace, name)
        return _decoded(found)["ca.crt"].encode()
    await api.request(
        "PATCH", path, {"data": body["data"]}, content_type="application/merge-patch+json"
    )
    log.info("renewed the webhook certificate in %s/%s", namespace, name)
    return made.ca


async def publish_ca_bundle(api: KubeAPI, configuration: str, ca: bytes) -> bool:
    """Set every webhook's caBundle in `configuration` to `ca`; whether anything changed."""
    path = f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{configuration}"
    current = await api.request("GET", path)
    bundle = _b64(ca)
    ops = [
        {"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": bundle}
        for index, hook in enumerate(current.get("webhooks") or [])
        if (hook.get("clientConfig") or {}).get("caBundle") != bundle
    ]
    if ops:
        await api.request("PATCH", path, ops, content_type="application/json-patch+json")
    return bool(ops)


async def bootstrap(
    api: KubeAPI, settings: BootstrapSettings, now: datetime.datetime
) -> dict[str, str]:
    """Run every configured step; the tokens (empty when the tokens step is off)."""
    tokens: dict[str, str] = {}
    if settings.tokens_secret:
        tokens = await ensure_tokens(api, settings)
        if settings.job_token_secret and settings.job_namespaces:
            await ensure_job_tokens(api, settings, tokens["job-token"])
    if settings.webhook_secret:
        ca = await ensure_webhook_certificate(api, settings, now)
        if settings.webhook_configuration:
            await publish_ca_bundle(api, settings.webhook_configuration, ca)
    return tokens
