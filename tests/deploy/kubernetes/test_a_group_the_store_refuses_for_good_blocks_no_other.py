"""One group whose ConfigMap write the API server refuses for good (422 every time: too
large, invalid) holds up no other write (kmock).

- the other group's ConfigMap and the agents' ConfigMap land; `flush` returns;
- the refused group is poisoned: logged at ERROR with its name and the API's reason,
  `error` names it, and its `commit` fails at once (StoreError naming the ConfigMap);
- through the engine: the poisoned group's Acquire fails UNAVAILABLE (the grant given
  back), while the other group's Acquire is granted and stored;
- once the server accepts the group's newer state, the poison clears.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import kmock
import pytest

from rlslice._errors import UnavailableError
from rlslice.adapters.kube import KubeAPI
from rlslice.config import GroupSpec
from rlslice.scheduler.core import GroupState
from rlslice.scheduler.core.registration import AgentSurvey
from rlslice.scheduler.engine import Engine
from rlslice.scheduler.metrics import SchedulerMetrics
from rlslice.scheduler.store import AgentRecord, StoreError
from rlslice.scheduler.store import kubernetes as kube_store
from rlslice.scheduler.store.kubernetes import KubernetesStore

from .conftest import NS, eventually

pytestmark = pytest.mark.timeout(30)
CONFIGMAPS = f"/api/v1/namespaces/{NS}/configmaps"
BAD = "t-group-bad"
REASON = '{"kind":"Status","reason":"RequestEntityTooLarge","message":"data too long"}'


async def _refuse_bad(cluster: kmock.KubernetesEmulator, on: dict[str, bool] | None = None) -> None:
    """Answer every PATCH of the bad group's ConfigMap 422 (while `on["refuse"]`). kmock
    answers 404 for a missing object before any rule, so the object is made first."""
    seed = KubernetesStore(KubeAPI(str(cluster.url)), NS, "t")
    seed.save_group(GroupState(spec=GroupSpec(name="bad"), epoch=1))
    await seed.close()
    body = REASON.encode()
    if on is None:
        cluster[f"patch {CONFIGMAPS}/{BAD}"] << 422 << body
    else:
        cluster[f"patch {CONFIGMAPS}/{BAD}"][lambda: on["refuse"]] << 422 << body


def _stored(cluster: kmock.KubernetesEmulator, name: str) -> dict[str, str]:
    return dict(cluster.objects["v1/configmaps", NS, name]["data"])


async def test_the_other_groups_and_the_agents_configmaps_land_and_the_refused_commit_fails_loudly(
    cluster: kmock.KubernetesEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    await _refuse_bad(cluster)
    store = KubernetesStore(KubeAPI(str(cluster.url), timeout=5), NS, "t")
    with caplog.at_level(logging.WARNING, logger="rlslice.scheduler.store.kubernetes"):
        store.save_group(GroupState(spec=GroupSpec(name="bad"), epoch=3))  # first in line
        store.save_group(GroupState(spec=GroupSpec(name="good"), epoch=4))
        store.save_agent(AgentRecord(node="n1", address="10.0.0.1:50552"))
        await asyncio.wait_for(store.flush(), 10)
        assert json.loads(_stored(cluster, "t-group-good")["state"])["epoch"] == 4
        assert "n1" in _stored(cluster, "t-agents")
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert any("group bad" in e and "HTTP 422" in e and "too long" in e for e in errors)
        assert store.error is not None
        assert "bad" in store.error
        assert "bad" in store.poisoned
        with pytest.raises(StoreError, match="refused for good") as caught:
            await store.commit("bad")
        assert BAD in str(caught.value)
        assert "HTTP 422" in str(caught.value)
        # The good group goes on being written, at once, beside the poisoned one.
        store.save_group(GroupState(spec=GroupSpec(name="good"), epoch=5))
        await asyncio.wait_for(store.commit("good"), 5)
        assert json.loads(_stored(cluster, "t-group-good")["state"])["epoch"] == 5
    await store.close()


async def test_through_the_engine_only_the_poisoned_group_is_refused_and_it_heals(
    cluster: kmock.KubernetesEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kube_store, "POISON_RETRY_SECONDS", 0.2)
    on = {"refuse": True}
    await _refuse_bad(cluster, on)
    store = KubernetesStore(KubeAPI(str(cluster.url), timeout=5), NS, "t")
    metrics = SchedulerMetrics()
    engine = Engine(store, _NoAgents(), metrics, auto_create_groups=True)
    await engine.start()
    engine.recover()
    try:
        bad = engine.register("bad", "a", 30, None, None, 0)
        good = engine.register("good", "b", 30, None, None, 0)
        await eventually(lambda: "bad" in store.poisoned, what="bad poisoned")
        with pytest.raises(UnavailableError, match="refused for good"):
            await engine.acquire("bad", "a", bad.lease_id, bad.secret, "")
        assert engine.groups["bad"].state.holder is None  # the grant was given back
        grant = await engine.acquire("good", "b", good.lease_id, good.secret, "")
        stored = json.loads(_stored(cluster, "t-group-good")["state"])
        assert (stored["holder"], stored["epoch"]) == ("b", grant.epoch)
        healthy = metrics.registry.get_sample_value("rlslice_scheduler_store_healthy")
        assert healthy == 0  # the health gauge says a group is refused
        on["refuse"] = False
        engine.keepalive(bad.lease_id, bad.secret)  # a newer state: tried again
        await eventually(lambda: not store.poisoned, what="bad written again")
        await engine.acquire("bad", "a", bad.lease_id, bad.secret, "")
        assert json.loads(_stored(cluster, BAD)["state"])["holder"] == "a"
    finally:
        await engine.close()
        await store.close()
        metrics.close()


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
