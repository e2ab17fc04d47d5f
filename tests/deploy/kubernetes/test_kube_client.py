"""The Kubernetes client (`rlslice.adapters.kube`, on `kubernetes_asyncio`) against kmock.

Case matrix:
- in-cluster, the service-account token file rotated (atomic rename, as the kubelet does)
  between two requests -> the second request carries the new token;
- in-cluster, the token file missing -> the request goes out without a token;
- kubeconfig with two contexts and an exec plugin (a real process printing an
  ExecCredential) -> the chosen context's server is used with the plugin's token;
- an error answer -> KubeError with the HTTP status; no answer -> KubeError(0).
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import kmock
import pytest
import yaml

from rlslice.adapters.kube import KubeAPI, KubeError

NS = "rlslice"
CONFIGMAPS = f"/api/v1/namespaces/{NS}/configmaps"


def _authorizations(cluster: kmock.KubernetesEmulator) -> list[str | None]:
    return [dict(r.headers).get("Authorization") for r in cluster if r.url.path == CONFIGMAPS]


def _write_token(directory: Path, token: str) -> None:
    """Replace the token file atomically, the way the kubelet swaps projected volumes."""
    fresh = directory / ".token.new"
    fresh.write_text(token + "\n")
    fresh.replace(directory / "token")


async def test_a_rotated_service_account_token_is_used_by_the_next_request(
    cluster: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    _write_token(tmp_path, "first-token")
    api = KubeAPI.in_cluster(service_account=tmp_path)
    try:
        await api.request("GET", CONFIGMAPS)
        _write_token(tmp_path, "rotated-token")
        await api.request("GET", CONFIGMAPS)
    finally:
        await api.close()
    assert _authorizations(cluster) == ["Bearer first-token", "Bearer rotated-token"]


async def test_without_a_token_file_requests_go_out_unauthenticated(
    cluster: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    api = KubeAPI.in_cluster(service_account=tmp_path)
    try:
        listing = await api.request("GET", CONFIGMAPS)
    finally:
        await api.close()
    assert listing.get("items") == []
    assert _authorizations(cluster) == [None]


async def test_a_kubeconfig_context_with_an_exec_plugin_authenticates_with_its_token(
    cluster: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    plugin = tmp_path / "get-token.py"
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {"token": "from-the-plugin"},
    }
    plugin.write_text(f"import json\nprint(json.dumps({credential!r}))\n")
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "elsewhere",
        "clusters": [
            {"name": "mock", "cluster": {"server": str(cluster.url).rstrip("/")}},
            {"name": "nowhere", "cluster": {"server": "http://127.0.0.1:9"}},
        ],
        "users": [
            {
                "name": "plugin",
                "user": {
                    "exec": {
                        "apiVersion": "client.authentication.k8s.io/v1",
                        "command": sys.executable,
                        "args": [str(plugin)],
                        "interactiveMode": "Never",
                    }
                },
            }
        ],
        "contexts": [
            {"name": "mock", "context": {"cluster": "mock", "user": "plugin"}},
            {"name": "elsewhere", "context": {"cluster": "nowhere", "user": "plugin"}},
        ],
    }
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(kubeconfig))
    api = KubeAPI.from_kubeconfig(path, context="mock")
    try:
        await api.request("GET", CONFIGMAPS)
    finally:
        await api.close()
    assert _authorizations(cluster) == ["Bearer from-the-plugin"]


async def test_an_error_answer_raises_with_its_status_and_no_answer_raises_status_zero(
    cluster: kmock.KubernetesEmulator,
) -> None:
    api = KubeAPI(str(cluster.url))
    try:
        with pytest.raises(KubeError) as missing:
            await api.request("GET", f"{CONFIGMAPS}/absent")
    finally:
        await api.close()
    assert missing.value.status == 404

    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    nobody = KubeAPI(f"http://127.0.0.1:{port}", timeout=5)
    try:
        with pytest.raises(KubeError) as unreachable:
            await nobody.request("GET", CONFIGMAPS)
    finally:
        await nobody.close()
    assert unreachable.value.status == 0
    assert json.dumps(str(unreachable.value))  # a message, not an empty error
