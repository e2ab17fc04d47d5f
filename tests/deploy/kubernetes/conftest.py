"""Fixtures for the Kubernetes wiring: kmock's emulated API server with the resources the
scheduler (Leases, ConfigMaps) and the agent (Pods, Nodes) use, and a polling helper."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import kmock
import pytest

NS = "rlslice"
T = TypeVar("T")


async def eventually(
    probe: Callable[[], Awaitable[T] | T], *, timeout: float = 10.0, what: str = "condition"
) -> T:
    """The first truthy result of `probe`, polled until `timeout` (tests only)."""
    deadline = asyncio.get_running_loop().time() + timeout
    last: Any = None
    while asyncio.get_running_loop().time() < deadline:
        last = probe()
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            return last  # type: ignore[no-any-return]
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}; last seen: {last!r}")


@pytest.fixture
def cluster(
    kmock: kmock.KubernetesEmulator, monkeypatch: pytest.MonkeyPatch
) -> kmock.KubernetesEmulator:
    """The emulator, reachable through `KubeAPI.in_cluster()` (RLSLICE_KUBE_API)."""
    info = kmock.ResourceInfo
    kmock.resources["coordination.k8s.io/v1/leases"] = info(
        kind="Lease", namespaced=True, verbs={"get", "create", "patch", "list"}
    )
    kmock.resources["v1/configmaps"] = info(
        kind="ConfigMap", namespaced=True, verbs={"get", "create", "patch", "list", "delete"}
    )
    kmock.resources["v1/pods"] = info(
        kind="Pod", namespaced=True, verbs={"get", "list", "watch", "create", "patch", "delete"}
    )
    kmock.resources["v1/nodes"] = info(kind="Node", namespaced=False, verbs={"get", "list"})
    monkeypatch.setenv("RLSLICE_KUBE_API", str(kmock.url))
    monkeypatch.setenv("RLSLICE_NAMESPACE", NS)
    return kmock
