"""Secrets the operator creates at run time (`rlslice.operator.bootstrap`), against kmock.

Case matrix:
- nothing exists -> the tokens Secret (three random tokens), the job token in each job
  namespace, the webhook TLS Secret (a certificate for the Service names, signed by the
  CA) and the webhook configuration's caBundle = that CA;
- a second start -> the same tokens and CA, no write at all;
- a tokens Secret given without one key -> that key is added, the others kept;
- a job namespace whose Secret holds a stale token -> updated to the job token;
- a certificate missing a name of the Service -> replaced, and the caBundle follows.
"""

from __future__ import annotations

import base64
import datetime
from typing import Any

import kmock
import pytest
from cryptography import x509

from rlslice.adapters.kube import KubeAPI
from rlslice.operator.bootstrap import BootstrapSettings, bootstrap

NS = "rl-system"
MWC = "admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
NOW = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)
NAMES = ("rls-webhook", "rls-webhook.rl-system", "rls-webhook.rl-system.svc")


@pytest.fixture
def cluster(kmock: kmock.KubernetesEmulator) -> kmock.KubernetesEmulator:
    kmock.resources["v1/secrets"] = kmock.ResourceInfo(
        kind="Secret", namespaced=True, verbs={"get", "create", "patch", "update", "list"}
    )
    kmock.resources[MWC] = kmock.ResourceInfo(
        kind="MutatingWebhookConfiguration", namespaced=False, verbs={"get", "patch", "list"}
    )
    kmock.objects[MWC, None, "rls-webhook"] = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "rls-webhook"},
        "webhooks": [{"name": "inject.rlslice.dev", "clientConfig": {"service": {}}}],
    }
    return kmock


def settings(names: tuple[str, ...] = NAMES) -> BootstrapSettings:
    return BootstrapSettings(
        namespace=NS,
        tokens_secret="rls-tokens",
        job_token_secret="rlslice-job-token",
        job_namespaces=("rl", "rl-eval"),
        webhook_secret="rls-webhook-tls",
        webhook_names=names,
        webhook_configuration="rls-webhook",
    )


def secret(cluster: kmock.KubernetesEmulator, namespace: str, name: str) -> dict[str, str]:
    data = cluster.objects["v1/secrets", namespace, name]["data"]
    return {k: base64.b64decode(v).decode() for k, v in data.items()}


def ca_bundle(cluster: kmock.KubernetesEmulator) -> bytes:
    hook = cluster.objects[MWC, None, "rls-webhook"]["webhooks"][0]
    return base64.b64decode(hook["clientConfig"]["caBundle"])


def writes(cluster: kmock.KubernetesEmulator) -> list[Any]:
    return [r for r in cluster if r.method in ("POST", "PUT", "PATCH")]


async def run(cluster: kmock.KubernetesEmulator, config: BootstrapSettings) -> dict[str, str]:
    api = KubeAPI(str(cluster.url))
    try:
        return await bootstrap(api, config, NOW)
    finally:
        await api.close()


async def test_a_first_start_creates_every_secret_and_publishes_the_ca(
    cluster: kmock.KubernetesEmulator,
) -> None:
    tokens = await run(cluster, settings())
    stored = secret(cluster, NS, "rls-tokens")
    assert stored == tokens
    assert sorted(tokens) == ["admin-token", "agent-token", "job-token"]
    assert len(set(tokens.values())) == 3
    assert all(len(t) >= 32 for t in tokens.values())
    for namespace in ("rl", "rl-eval"):
        assert secret(cluster, namespace, "rlslice-job-token") == {"token": tokens["job-token"]}

    tls = secret(cluster, NS, "rls-webhook-tls")
    assert cluster.objects["v1/secrets", NS, "rls-webhook-tls"]["type"] == "kubernetes.io/tls"
    ca = x509.load_pem_x509_certificate(tls["ca.crt"].encode())
    cert = x509.load_pem_x509_certificate(tls["tls.crt"].encode())
    cert.verify_directly_issued_by(ca)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(sans.get_values_for_type(x509.DNSName)) == set(NAMES)
    assert ca_bundle(cluster) == tls["ca.crt"].encode()


async def test_a_second_start_keeps_tokens_and_ca_and_writes_nothing(
    cluster: kmock.KubernetesEmulator,
) -> None:
    first = await run(cluster, settings())
    ca = ca_bundle(cluster)
    before = len(writes(cluster))
    second = await run(cluster, settings())
    assert second == first
    assert ca_bundle(cluster) == ca
    assert writes(cluster)[before:] == []


async def test_given_secrets_are_completed_and_stale_job_tokens_replaced(
    cluster: kmock.KubernetesEmulator,
) -> None:
    given = {"job-token": "job-given", "admin-token": "admin-given"}
    cluster.objects["v1/secrets", NS, "rls-tokens"] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "rls-tokens", "namespace": NS},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in given.items()},
    }
    cluster.objects["v1/secrets", "rl", "rlslice-job-token"] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "rlslice-job-token", "namespace": "rl"},
        "data": {"token": base64.b64encode(b"stale").decode()},
    }
    tokens = await run(cluster, settings())
    assert tokens["job-token"] == "job-given"
    assert tokens["admin-token"] == "admin-given"
    assert tokens["agent-token"]
    assert secret(cluster, NS, "rls-tokens") == tokens
    assert secret(cluster, "rl", "rlslice-job-token") == {"token": "job-given"}


async def test_a_certificate_missing_a_service_name_is_replaced_and_the_bundle_follows(
    cluster: kmock.KubernetesEmulator,
) -> None:
    await run(cluster, settings(names=NAMES[:1]))
    old_ca = ca_bundle(cluster)
    await run(cluster, settings())
    tls = secret(cluster, NS, "rls-webhook-tls")
    cert = x509.load_pem_x509_certificate(tls["tls.crt"].encode())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(sans.get_values_for_type(x509.DNSName)) == set(NAMES)
    assert ca_bundle(cluster) == tls["ca.crt"].encode() != old_ca
