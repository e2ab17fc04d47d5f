"""Each store write carries the leader's precondition (issue 25, defect 9): right before
writing, the store asks the elector whether the Lease, read now, still names this replica.

- a leader whose Lease another replica took (while its own clock still said "leading")
  writes nothing: its commit fails, the ConfigMap keeps the new leader's state, and it
  steps down at once
- while the Lease is ours, writes land as before
"""

from __future__ import annotations

import json

import kmock
import pytest

from rlslice.config import GroupSpec
from rlslice.scheduler.core import GroupState
from rlslice.scheduler.leader import LeaseElector
from rlslice.scheduler.store.base import StoreError
from rlslice.scheduler.store.kubernetes import KubeAPI, KubernetesStore

from .conftest import NS


def leads(elector: LeaseElector) -> bool:
    return elector.leading


async def test_a_deposed_leaders_late_write_is_refused(cluster: kmock.KubernetesEmulator) -> None:
    old = LeaseElector(KubeAPI(str(cluster.url)), NS, "store-fence", "old", duration=15)
    assert await old.step()
    store = KubernetesStore(KubeAPI(str(cluster.url)), NS, "f")
    store.fence = lambda: old.leading
    store.precondition = old.confirm

    store.save_group(GroupState(spec=GroupSpec(name="g"), epoch=1))
    await store.commit("g")  # ours: it lands
    stored = cluster.objects["v1/configmaps", NS, "f-group-g"]["data"]["state"]
    assert json.loads(stored)["epoch"] == 1

    # Another replica takes the Lease (its clock, not ours, says it lapsed) and writes.
    admin = KubeAPI(str(cluster.url))
    await admin.request(
        "PATCH",
        old.path,
        {"spec": {"holderIdentity": "new"}},
        content_type="application/merge-patch+json",
    )
    new_state = GroupState(spec=GroupSpec(name="g"), epoch=2)
    new_store = KubernetesStore(admin, NS, "f")
    new_store.save_group(new_state)
    await new_store.commit("g")
    assert leads(old)  # the old leader's own clock has not run out yet

    store.save_group(GroupState(spec=GroupSpec(name="g"), epoch=9))  # the late write
    with pytest.raises(StoreError, match="not ours any more"):
        await store.commit("g")
    assert not leads(old)  # it stepped down
    stored = cluster.objects["v1/configmaps", NS, "f-group-g"]["data"]["state"]
    assert json.loads(stored)["epoch"] == 2  # the new leader's state stands
    await store.flush()  # the background writer drops it too (fenced)
    stored = cluster.objects["v1/configmaps", NS, "f-group-g"]["data"]["state"]
    assert json.loads(stored)["epoch"] == 2
    await store.close()
    await new_store.close()
    await old.api.close()
