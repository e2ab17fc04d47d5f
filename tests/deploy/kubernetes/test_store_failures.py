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

Commit before grant (the engine awaits `commit` before a grant takes effect):
- a grant is answered only once its group's ConfigMap holds it;
- a write answered 500 fails the acquire UNAVAILABLE naming the store's ConfigMap (each
  attempt of its switch counted as a store refusal), the group not held; once the server recovers the next acquire is
  granted and stored;
- `commit` retries a create race (409) on the winner's object, and fails at once on
  429, 500 and a hung server (the client's deadline);
- a job that leaves while the switch parking it waits for its write is released only
  after that switch.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest

from rlslice._errors import UnavailableError
from rlslice.adapters.kube import KubeAPI
from rlslice.config import GroupSpec
from rlslice.scheduler.core import MAX_SWITCH_ATTEMPTS, GroupState, events
from rlslice.scheduler.core.registration import AgentSurvey
from rlslice.scheduler.engine import Engine
from rlslice.scheduler.metrics import SchedulerMetrics
from rlslice.scheduler.store import StoreError
from rlslice.scheduler.store.kubernetes import KubernetesStore

from .conftest import NS, eventually

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


# -- commit before grant ------------------------------------------------------------------


class _NoAgents:
    """No agents: every switch is a pure lock handoff."""

    def nodes_for(self, spec: GroupSpec) -> tuple[str, ...]:
        return ()

    async def run_switch(self, state: GroupState, switch: Any) -> Any:
        raise AssertionError("no agents, no switches")

    async def release(self, spec: GroupSpec, job: str, force: bool) -> None:
        return None

    async def survey(self, spec: GroupSpec) -> AgentSurvey:
        return AgentSurvey()


@contextlib.asynccontextmanager
async def _engine(cluster: kmock.KubernetesEmulator) -> AsyncIterator[Engine]:
    store = KubernetesStore(KubeAPI(str(cluster.url), timeout=5), NS, "t")
    metrics = SchedulerMetrics()
    engine = Engine(store, _NoAgents(), metrics, auto_create_groups=True)
    await engine.start()
    engine.recover()
    try:
        yield engine
    finally:
        await engine.close()
        await store.close()
        metrics.close()


def _stored(cluster: kmock.KubernetesEmulator) -> dict[str, Any]:
    return dict(json.loads(cluster.objects["v1/configmaps", NS, NAME]["data"]["state"]))


def _refusals(engine: Engine) -> float:
    value = engine.metrics.registry.get_sample_value("rlslice_scheduler_store_refusals_total")
    return float(value or 0.0)


async def test_a_grant_is_answered_only_once_its_configmap_holds_it(
    cluster: kmock.KubernetesEmulator,
) -> None:
    async with _engine(cluster) as engine:
        a = engine.register("g1", "a", 30, None, None, 0)
        grant = await engine.acquire("g1", "a", a.lease_id, a.secret, "")
        stored = _stored(cluster)  # read at once: no flush in between
        assert (stored["holder"], stored["epoch"]) == ("a", grant.epoch)


async def test_a_grant_the_store_cannot_write_fails_unavailable_naming_the_store(
    cluster: kmock.KubernetesEmulator,
) -> None:
    down = {"on": False}
    cluster[f"patch {CONFIGMAPS}/{NAME}"][lambda: down["on"]] << 500
    async with _engine(cluster) as engine:
        a = engine.register("g1", "a", 30, None, None, 0)
        await engine.store.flush()
        down["on"] = True
        try:
            with pytest.raises(UnavailableError) as caught:
                await engine.acquire("g1", "a", a.lease_id, a.secret, "")
        finally:
            down["on"] = False
        assert "kubernetes store" in str(caught.value)
        assert NAME in str(caught.value)
        assert "HTTP 500" in str(caught.value)
        assert engine.groups["g1"].state.holder is None
        # The job's first switch (lock only: no agents) is tried twice, refused each time.
        assert _refusals(engine) == MAX_SWITCH_ATTEMPTS
        grant = await engine.acquire("g1", "a", a.lease_id, a.secret, "")
        assert (_stored(cluster)["holder"], _stored(cluster)["epoch"]) == ("a", grant.epoch)


async def test_a_commit_retries_a_create_race_on_the_winners_object(
    cluster: kmock.KubernetesEmulator,
) -> None:
    cluster[f"post {CONFIGMAPS}"][:1] << 409
    store = KubernetesStore(KubeAPI(str(cluster.url)), NS, "t")
    store.save_group(_state(5))
    await store.commit("g1")  # takes the group's lock before the writer runs
    assert _stored_epoch(cluster) == 5
    assert store.error is None
    await store.close()


@pytest.mark.parametrize("status", [429, 500, None], ids=["429", "500", "hung"])
async def test_a_commit_fails_at_once_when_the_server_refuses_or_hangs(
    cluster: kmock.KubernetesEmulator, status: int | None
) -> None:
    await _seed(cluster)
    released = asyncio.Event()

    async def hang() -> None:
        await released.wait()

    cluster[f"patch {CONFIGMAPS}/{NAME}"][1:2] << (hang if status is None else status)
    store = KubernetesStore(KubeAPI(str(cluster.url), timeout=0.3), NS, "t")
    store.save_group(_state(8))
    try:
        with pytest.raises(StoreError, match=NAME) as caught:
            await store.commit("g1")
    finally:
        released.set()
    assert f"HTTP {status or 0}" in str(caught.value)
    assert store.error is not None
    await store.close()  # the background writer lands it after all
    assert _stored_epoch(cluster) == 8


@dataclasses.dataclass
class _Recording:
    """One agent node; every switch succeeds; the order of switches and releases is kept."""

    log: list[str] = dataclasses.field(default_factory=list)

    def nodes_for(self, spec: GroupSpec) -> tuple[str, ...]:
        return ("n1",)

    async def run_switch(self, state: GroupState, switch: Any) -> Any:
        self.log.append(f"switch to {switch.incoming} evicting {','.join(switch.evict)}")
        await asyncio.sleep(0)  # the agents' calls take a while
        self.log.append(f"switch to {switch.incoming} done")
        return events.SwitchDone(switch.epoch, switch.evict + switch.candidates)

    async def release(self, spec: GroupSpec, job: str, force: bool) -> None:
        self.log.append(f"release {job}")

    async def survey(self, spec: GroupSpec) -> AgentSurvey:
        return AgentSurvey()


async def test_a_job_that_leaves_while_its_switch_is_being_stored_is_released_after_it(
    cluster: kmock.KubernetesEmulator,
) -> None:
    # The switch that parks a is held until its ConfigMap write lands; a's Unregister comes
    # in meanwhile. Releasing a before that switch runs would let the switch snapshot a
    # job that already left: its processes frozen, its parked copy kept, for good.
    runner = _Recording()
    store = KubernetesStore(KubeAPI(str(cluster.url), timeout=5), NS, "t")
    metrics = SchedulerMetrics()
    engine = Engine(store, runner, metrics, auto_create_groups=True)
    await engine.start()
    engine.recover()
    try:
        a = engine.register("g1", "a", 30, None, None, 0)
        b = engine.register("g1", "b", 30, None, None, 0)
        await engine.acquire("g1", "a", a.lease_id, a.secret, "")
        waiting = asyncio.ensure_future(engine.acquire("g1", "b", b.lease_id, b.secret, ""))
        await eventually(lambda: engine.groups["g1"].state.queue, what="b queued")
        engine.yield_("g1", "a", a.lease_id, a.secret)  # the switch to b: stored first
        engine.unregister(a.lease_id, a.secret)
        grant = await asyncio.wait_for(waiting, 10)
        assert grant.job == "b"
        await eventually(lambda: "release a" in runner.log, what="a released")
        assert runner.log.index("release a") > runner.log.index("switch to b done"), runner.log
    finally:
        await engine.close()
        await store.close()
        metrics.close()
