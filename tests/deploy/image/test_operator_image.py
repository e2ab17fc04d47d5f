"""The operator image, as the chart runs its two Deployments (controller and webhook roles),
against a Kubernetes API on the host's loopback (kmock's emulator in the test's loop).

Each container has its own network namespace (podman's slirp4netns, which reaches the
host's loopback at 10.0.2.2 with allow_host_loopback); its probe and webhook ports are
published on 127.0.0.1 only. User 65532, read-only root, no capabilities, an emptyDir-like
/tmp, the chart's env; a kubeconfig pointing at the emulator stands in for the service
account (kopf and kubernetes_asyncio both read KUBECONFIG).

Cases:
- the webhook container answers its liveness probe (/healthz) and an AdmissionReview for a
  labelled pod of a namespace the group admits with a JSONPatch that names the job and
  mounts the agent's socket directory;
- the controller container answers /healthz and writes the tokens Secret it makes at start
  into the API.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import ipaddress
import json
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import kmock
import pytest
import yaml

from rlslice.testing import free_port

from . import components
from .conftest import Engine

# The first test to ask for the image builds it (about 1-2 min on 2 cores, more with a
# fresh mmdebstrap base): beyond pytest's default per-test timeout.
pytestmark = pytest.mark.timeout(600)
ROOT = Path(__file__).resolve().parents[3]
NAMESPACE = "rl-system"
T = TypeVar("T")


async def eventually(probe: Callable[[], Awaitable[T]], what: str, timeout: float = 60) -> T:
    """The first truthy result of `probe`, polled until `timeout`."""
    deadline = asyncio.get_running_loop().time() + timeout
    last: Any = None
    while asyncio.get_running_loop().time() < deadline:
        try:
            last = await probe()
        except (aiohttp.ClientError, OSError) as error:
            last = error  # not up yet
        else:
            if last:
                return last  # type: ignore[no-any-return]
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; last seen: {last!r}")


def _crd() -> dict[str, Any]:
    found = sorted(ROOT.glob("charts/rlslice/**/timeslicegroups.rlslice.dev.yaml"))
    assert found, "the TimeSliceGroup CRD is not in the chart"
    crd: dict[str, Any] = yaml.safe_load(found[0].read_text())
    return crd


@pytest.fixture
def k8s(kmock: kmock.KubernetesEmulator) -> kmock.KubernetesEmulator:
    """The emulator with what the operator's roles discover, read and write."""
    info = kmock.ResourceInfo
    kmock.resources["v1/namespaces"] = info(
        kind="Namespace", namespaced=False, verbs={"list", "watch", "get"}
    )
    kmock.resources["apiextensions.k8s.io/v1/customresourcedefinitions"] = info(
        kind="CustomResourceDefinition", namespaced=False, verbs={"list", "watch", "get"}
    )
    kmock.resources["rlslice.dev/v1alpha1/timeslicegroups"] = info(
        kind="TimeSliceGroup",
        singular="timeslicegroup",
        namespaced=False,
        shortnames={"tsg"},
        subresources={"status"},
        verbs={"list", "watch", "get", "patch", "create", "delete", "update"},
    )
    kmock.resources["v1/pods"] = info(kind="Pod", namespaced=True, verbs={"list", "watch", "get"})
    kmock.resources["v1/events"] = info(kind="Event", namespaced=True, verbs={"create"})
    kmock.resources["v1/secrets"] = info(
        kind="Secret",
        namespaced=True,
        verbs={"list", "watch", "get", "create", "patch", "update"},
    )
    kmock.resources["admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"] = info(
        kind="MutatingWebhookConfiguration",
        namespaced=False,
        verbs={"list", "watch", "get", "patch", "update"},
    )
    crd = _crd()
    kmock.objects[
        "apiextensions.k8s.io/v1/customresourcedefinitions", None, crd["metadata"]["name"]
    ] = crd
    kmock.objects["v1/namespaces", None, NAMESPACE] = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": NAMESPACE},
    }
    # The chart installs it; the controller keeps its caBundle.
    kmock.objects[
        "admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", None, "rls-webhook"
    ] = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "rls-webhook"},
        "webhooks": [{"name": "inject.rlslice.dev", "clientConfig": {}}],
    }
    kmock.objects["rlslice.dev/v1alpha1/timeslicegroups", None, "rl-a"] = {
        "apiVersion": "rlslice.dev/v1alpha1",
        "kind": "TimeSliceGroup",
        "metadata": {"name": "rl-a", "uid": "tsg-rl-a", "resourceVersion": "1"},
        "spec": {"nodeSelector": {"gpu": "h200"}, "backend": "sim", "namespaces": ["rl"]},
    }
    return kmock


def _certificate(folder: Path) -> Path:
    """A self-signed certificate for 127.0.0.1 as the webhook Secret's tls.crt / tls.key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rlslice-webhook")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    folder.mkdir()
    (folder / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "tls.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    for path in folder.iterdir():
        path.chmod(0o644)  # a Secret volume's files are readable by the pod's user
    return folder / "tls.crt"


def _kubeconfig(path: Path, port: int) -> Path:
    server = f"http://10.0.2.2:{port}"  # the host's loopback, seen from slirp4netns
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "kmock", "cluster": {"server": server}}],
                "users": [{"name": "operator", "user": {"token": "kmock-token"}}],
                "contexts": [
                    {
                        "name": "kmock",
                        "context": {"cluster": "kmock", "user": "operator"},
                    }
                ],
                "current-context": "kmock",
            }
        )
    )
    path.chmod(0o644)
    return path


async def _start(
    engine: Engine, image: str, spec: components.Component, mounts: list[str], ports: list[str]
) -> str:
    name = engine.name(spec.deployment)
    flags = [
        "--network=slirp4netns:allow_host_loopback=true",
        *spec.flags(podman=True),
        *(item for port in ports for item in ("-p", port)),
        *(item for mount in mounts for item in ("-v", mount)),
    ]
    await asyncio.to_thread(engine, "run", "-d", "--name", name, *flags, image, *spec.args)
    return name


async def _healthy(url: str) -> bool:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status == 200


@pytest.fixture
def podman_only(engine: Engine) -> Engine:
    if "podman" not in engine.binary:
        pytest.skip("the operator containers reach the host's loopback through slirp4netns")
    return engine


async def test_the_webhook_container_answers_its_probe_and_mutates_a_labelled_pod(
    k8s: kmock.KubernetesEmulator,  # first: torn down after the containers are gone
    podman_only: Engine,
    image: str,
    containers: Engine,
    tmp_path: Path,
) -> None:
    ca = _certificate(tmp_path / "webhook-tls")
    kubeconfig = _kubeconfig(tmp_path / "kubeconfig", int(k8s.url.port or 0))
    health, webhook = free_port(), free_port()
    name = await _start(
        containers,
        image,
        components.webhook(NAMESPACE),
        [f"{ca.parent}:/etc/rlslice/webhook:ro", f"{kubeconfig}:/etc/kube/config:ro"],
        [f"127.0.0.1:{health}:8080", f"127.0.0.1:{webhook}:9443"],
    )
    try:
        await eventually(lambda: _healthy(f"http://127.0.0.1:{health}/healthz"), "/healthz")
    except AssertionError:
        print(containers("logs", name, check=False).stderr[-4000:])
        raise
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "sampler-",
            "namespace": "rl",
            "labels": {"rlslice.dev/group": "rl-a"},
        },
        "spec": {"containers": [{"name": "main", "image": "sampler:1"}]},
    }
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "review-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "rl",
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:rl:default"},
            "object": pod,
            "dryRun": False,
        },
    }
    context = ssl.create_default_context(cafile=str(ca))

    async def answered() -> dict[str, Any] | None:
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"https://127.0.0.1:{webhook}/inject", json=review, ssl=context) as r,
        ):
            answer: dict[str, Any] = await r.json()
            # Until the groups index has rl-a, the pod is let through unchanged.
            return answer if r.status == 200 and answer["response"].get("patch") else None

    answer = await eventually(answered, "a JSONPatch from the webhook")
    assert answer["response"]["uid"] == "review-1"
    assert answer["response"]["allowed"] is True
    ops = json.loads(base64.b64decode(answer["response"]["patch"]))
    paths = {op["path"] for op in ops}
    assert "/metadata/labels/rlslice.dev~1job" in paths, ops  # the job's id
    assert "/spec/volumes" in paths, ops  # the agent's socket directory


async def test_the_controller_container_answers_its_probe_and_makes_the_tokens_secret(
    k8s: kmock.KubernetesEmulator,  # first: torn down after the containers are gone
    podman_only: Engine,
    image: str,
    containers: Engine,
    tmp_path: Path,
) -> None:
    kubeconfig = _kubeconfig(tmp_path / "kubeconfig", int(k8s.url.port or 0))
    health = free_port()
    name = await _start(
        containers,
        image,
        components.controller(NAMESPACE),
        [f"{kubeconfig}:/etc/kube/config:ro"],
        [f"127.0.0.1:{health}:8080"],
    )
    try:
        await eventually(lambda: _healthy(f"http://127.0.0.1:{health}/healthz"), "/healthz")

        async def tokens() -> bool:
            try:
                secret = k8s.objects["v1/secrets", NAMESPACE, "rls-tokens"]
            except KeyError:
                return False
            return {"job-token", "admin-token", "agent-token"} <= set(secret.raw["data"])

        await eventually(tokens, "the tokens Secret")
    except AssertionError:
        print(containers("logs", name, check=False).stderr[-4000:])
        raise
