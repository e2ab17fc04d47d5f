"""The Kubernetes store when the API server refuses or does not answer (kmock).

Case matrix
(each: the state lands once the server recovers, a warning names each failed attempt, and
`error` is clear again after the write)
- PATCH answered 500 twice;
- PATCH answered 429 with Retry-After;
- PATCH 404 (no ConfigMap yet), then POST answered 409 (a create race): the next round
  patches the object the other writer made;
- PATCH that never answers (a hung server): the client's deadline ends it, the retry lands;
- a fence that says "not leading": nothing is written, flush returns, `error` says so.
"""

from __future__ import annotations

import asyncio
import json
import logging

import kmock
import pytest

from rlslice.adapters.kube import KubeAPI
from rlslice.config import GroupSpec
from rlslice.scheduler.core import GroupState
from rlslice.scheduler.store.kubernetes import KubernetesStore

from .conftest import NS

pytestmark = pytest.mark.timeout(30)
CONFIGMAPS = f"/api/v1/namespaces/{NS}/configmaps"
NAME = "t-group-g1"


def _state(epoch: int) -> GroupState:
    return GroupState(spec=GroupSpec(name="g1"), epoch=epoch)


def _stored_epoch(cluster: kmock.KubernetesEmulator) -> int:
    data = cluster.objects["v1/configmaps", NS, NAME]["data"]
    return int(json.loads(data["state"])["epoch"])


async def _write_through(
    cluster: kmock.KubernetesEmulator, caplog: pytest.LogCaptureFixture, *, timeout: float = 10.0
) -> tuple[KubernetesStore, list[str]]:
    """Save one state and flush; the store and the write failures it logged on the way."""
    store = KubernetesStore(KubeAPI(str(cluster.url), timeout=timeout), NS, "t")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rlslice.scheduler.store.kubernetes"):
        store.save_group(_state(7))
        await asyncio.wait_for(store.flush(), 20)
    return store, [r.getMessage() for r in caplog.records]


async def _seed(cluster: kmock.KubernetesEmulator) -> None:
    store = KubernetesStore(KubeAPI(str(cluster.url)), NS, "t")
    store.save_group(_state(1))
    await store.close()


async def test_server_errors_are_retried_until_the_state_lands(
    cluster: kmock.KubernetesEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    await _seed(cluster)
    # kmock slices count every matching request so far: the seed made the first PATCH.
    cluster[f"patch {CONFIGMAPS}/{NAME}"][1:3] << 500
    store, seen = await _write_through(cluster, caplog)
    await store.close()
    assert _stored_epoch(cluster) == 7
    assert any("HTTP 500" in e for e in seen)
    assert store.error is None  # healthy again after the write


async def test_too_many_requests_waits_and_retries(
    cluster: kmock.KubernetesEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    await _seed(cluster)
    cluster[f"patch {CONFIGMAPS}/{NAME}"][1:2] << 429 << {"Retry-After": "0"}
    store, seen = await _write_through(cluster, caplog)
    await store.close()
    assert _stored_epoch(cluster) == 7
    assert any("HTTP 429" in e for e in seen)


async def test_a_create_race_is_resolved_by_patching_the_winners_object(
    cluster: kmock.KubernetesEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    cluster[f"post {CONFIGMAPS}"][:1] << 409
    store, seen = await _write_through(cluster, caplog)
    await store.close()
    assert _stored_epoch(cluster) == 7
    assert any("HTTP 409" in e for e in seen)


async def test_a_hung_write_ends_at_the_deadline_and_is_retried(
    cluster: kmock.KubernetesEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    await _seed(cluster)
    released = asyncio.Event()

    async def hang() -> None:
        await released.wait()

    cluster[f"patch {CONFIGMAPS}/{NAME}"][1:2] << hang
    try:
        store, seen = await _write_through(cluster, caplog, timeout=0.3)
        await store.close()
    finally:
        released.set()
    assert _stored_epoch(cluster) == 7
    assert any("HTTP 0" in e for e in seen)


async def test_a_replica_that_lost_the_lease_writes_nothing(
    cluster: kmock.KubernetesEmulator,
) -> None:
    store = KubernetesStore(KubeAPI(str(cluster.url)), NS, "t")
    store.fence = lambda: False
    store.save_group(_state(9))
    await asyncio.wait_for(store.flush(), 5)
    await store.close()
    assert [r for r in cluster if r.method in ("PATCH", "POST")] == []
    assert store.error is not None
    assert "not leading" in store.error
