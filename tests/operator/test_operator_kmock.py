"""The operator end to end: the real kopf runtime against kmock, a real scheduler on loopback.

Scenarios:
- create a TimeSliceGroup -> the scheduler has the group; status (through the status
  subresource) says Ready with the scheduler's view; progress and diff-base live in
  `rlslice.dev` annotations; our finalizer is on it
- update its spec -> the scheduler gets the new spec; observedGeneration follows
- an invalid spec -> nothing in the scheduler, Ready False InvalidSpec
- the scheduler loses the group (restart without a store) -> the timer puts it back
- delete while a job holds it -> the finalizer waits; the holder yields -> group deleted,
  finalizer removed, object gone
- delete while a holder never yields -> forced after the timeout
- a pod admission request through the webhook -> the patch `mutate()` computes
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import aiohttp
import jsonpatch
import kmock
import pytest

from rlslice.operator.mutation import mutate
from rlslice.v1alpha1 import scheduler_pb2, scheduler_pb2_grpc

from .conftest import ADMIN_TOKEN, TSG, TSG_URL, Operator, Scheduler, eventually

pytestmark = pytest.mark.timeout(60)


def group(name: str = "rl-a", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "rlslice.dev/v1alpha1",
        "kind": "TimeSliceGroup",
        # kmock keeps no resourceVersion; kopf's JSON patches test it, so give one.
        "metadata": {"name": name, "generation": 1, "uid": f"uid-{name}", "resourceVersion": "1"},
        "spec": {"backend": "sim", "policy": "fifo", "leaseSeconds": 30, **spec},
    }


async def scheduler_group(scheduler: Scheduler, name: str) -> scheduler_pb2.GroupStatus | None:
    from rlslice.adapters.channel import open_channel

    async with open_channel(scheduler.address, token=ADMIN_TOKEN) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        try:
            return await stub.GetGroup(scheduler_pb2.GetGroupRequest(group=name), timeout=5)
        except Exception:
            return None


def stored(k8s: kmock.KubernetesEmulator, name: str) -> dict[str, Any] | None:
    try:
        obj = k8s.objects[TSG, None, name]
    except KeyError:
        return None
    return None if obj.deleted else dict(obj.raw)


def ready(k8s: kmock.KubernetesEmulator, name: str) -> dict[str, Any] | None:
    body = stored(k8s, name) or {}
    for condition in (body.get("status") or {}).get("conditions", []):
        if condition["type"] == "Ready" and condition["status"] == "True":
            return body
    return None


async def test_a_created_group_reaches_the_scheduler_and_reports_status(
    k8s: kmock.KubernetesEmulator, scheduler: Scheduler, operator: Operator
) -> None:
    await k8s.post(
        TSG_URL, json=group(nodeSelector={"matchLabels": {"gpu": "h200"}}, namespaces=["rl"])
    )
    status = await eventually(lambda: scheduler_group(scheduler, "rl-a"), what="group put")
    assert status.spec.backend == "sim"
    assert dict(status.spec.node_selector) == {"gpu": "h200"}

    body = await eventually(lambda: ready(k8s, "rl-a"), what="Ready status")
    assert body["status"]["phase"] == "Idle"
    assert body["status"]["queueLength"] == 0
    assert body["status"]["observedGeneration"] == 1
    assert "rlslice.dev/finalizer" in body["metadata"]["finalizers"]
    # kopf writes its annotations and the status in separate patches (the status through
    # its subresource), so they may land in either order.
    annotations = await eventually(
        lambda: (stored(k8s, "rl-a") or {})["metadata"].get("annotations"), what="annotations"
    )
    assert "rlslice.dev/last-handled-configuration" in annotations
    assert not any(key.startswith("kopf.zalando.org") for key in annotations)
    status_patches = [r for r in k8s if r.method == "PATCH" and r.url.path.endswith("/rl-a/status")]
    assert status_patches, "status must be written through the status subresource"


async def test_an_idle_group_costs_the_api_server_no_writes(
    k8s: kmock.KubernetesEmulator, operator: Operator
) -> None:
    await k8s.post(TSG_URL, json=group())
    await eventually(lambda: ready(k8s, "rl-a"), what="Ready status")
    await asyncio.sleep(0.5)
    before = len([r for r in k8s if r.method == "PATCH"])
    await asyncio.sleep(5 * operator.config.status_interval)  # five timer runs
    patches = [r for r in k8s if r.method == "PATCH"][before:]
    assert patches == [], [(r.url.path, r.data) for r in patches]


async def test_an_updated_spec_is_reconciled_into_the_scheduler(
    k8s: kmock.KubernetesEmulator, scheduler: Scheduler, operator: Operator
) -> None:
    await k8s.post(TSG_URL, json=group())
    await eventually(lambda: ready(k8s, "rl-a"), what="Ready status")
    await k8s.patch(
        f"{TSG_URL}/rl-a",
        json={"metadata": {"generation": 2}, "spec": {"leaseSeconds": 12, "policy": "fair"}},
        headers={"Content-Type": "application/merge-patch+json"},
    )

    async def updated() -> bool:
        status = await scheduler_group(scheduler, "rl-a")
        return status is not None and status.spec.lease_seconds == 12

    await eventually(updated, what="new lease in the scheduler")
    status = await scheduler_group(scheduler, "rl-a")
    assert status is not None
    assert status.spec.policy == scheduler_pb2.POLICY_FAIR
    await eventually(
        lambda: (stored(k8s, "rl-a") or {}).get("status", {}).get("observedGeneration") == 2,
        what="observedGeneration 2",
    )


async def test_an_invalid_spec_is_refused_and_reported(
    k8s: kmock.KubernetesEmulator, scheduler: Scheduler, operator: Operator
) -> None:
    await k8s.post(TSG_URL, json=group(jobs=[{"name": "a"}, {"name": "a"}]))

    def refused() -> dict[str, Any] | None:
        status = (stored(k8s, "rl-a") or {}).get("status") or {}
        for condition in status.get("conditions", []):
            if condition["reason"] == "InvalidSpec":
                return condition
        return None

    condition = await eventually(refused, what="InvalidSpec condition")
    assert condition["message"].startswith("spec.jobs[1].name:")
    assert await scheduler_group(scheduler, "rl-a") is None


async def test_the_timer_puts_back_a_group_the_scheduler_lost(
    k8s: kmock.KubernetesEmulator, scheduler: Scheduler, operator: Operator
) -> None:
    await k8s.post(TSG_URL, json=group())
    await eventually(lambda: ready(k8s, "rl-a"), what="Ready status")
    from rlslice.adapters.channel import open_channel

    async with open_channel(scheduler.address, token=ADMIN_TOKEN) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        await stub.DeleteGroup(scheduler_pb2.DeleteGroupRequest(group="rl-a"), timeout=5)
    await eventually(lambda: scheduler_group(scheduler, "rl-a"), what="group put back")


async def test_a_pod_admission_request_gets_the_patch_mutate_computes(
    k8s: kmock.KubernetesEmulator, operator: Operator
) -> None:
    await k8s.post(
        TSG_URL, json=group(nodeSelector={"matchLabels": {"gpu": "h200"}}, namespaces=["rl"])
    )
    await eventually(lambda: ready(k8s, "rl-a"), what="Ready status")
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
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{operator.webhook_url}/inject", json=review) as response,
    ):
        assert response.status == 200
        answer = await response.json()
    assert answer["response"]["uid"] == "review-1"
    assert answer["response"]["allowed"] is True
    assert answer["response"]["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(answer["response"]["patch"]))
    expected = jsonpatch.apply_patch(
        pod,
        mutate(
            pod,
            {"spec": {"nodeSelector": {"matchLabels": {"gpu": "h200"}}, "backend": "sim"}},
            operator.config.injection,
        ),
    )
    assert jsonpatch.apply_patch(pod, ops) == expected
    assert expected["spec"]["nodeSelector"] == {"gpu": "h200"}
    assert expected["metadata"]["labels"]["rlslice.dev/job"] == "sampler"
    # The group runs on the sim backend: the pod learns where the emulated devices are.
    env = {e["name"] for e in expected["spec"]["containers"][0]["env"]}
    assert {"RLSLICE_SIM_ROOT", "RLSLICE_NODE"} <= env


async def hold(scheduler: Scheduler, group_name: str, job: str) -> scheduler_pb2.RegisterResponse:
    """Register `job` and acquire the group with the real protocol; the lease proves it."""
    from rlslice.adapters.channel import open_channel

    async with open_channel(scheduler.address, token=ADMIN_TOKEN) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        lease = await stub.Register(
            scheduler_pb2.RegisterRequest(job=job, group=group_name, lease_seconds=60), timeout=5
        )
        await stub.Acquire(
            scheduler_pb2.AcquireRequest(
                job=job, group=group_name, lease_id=lease.lease_id, secret=lease.secret
            ),
            timeout=10,
        )
        return lease


async def release(
    scheduler: Scheduler, group_name: str, job: str, lease: scheduler_pb2.RegisterResponse
) -> None:
    from rlslice.adapters.channel import open_channel

    async with open_channel(scheduler.address, token=ADMIN_TOKEN) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        await stub.Yield(
            scheduler_pb2.YieldRequest(
                job=job, group=group_name, lease_id=lease.lease_id, secret=lease.secret
            ),
            timeout=5,
        )


async def test_deleting_a_held_group_waits_for_the_holder_to_yield(
    k8s: kmock.KubernetesEmulator, scheduler: Scheduler, operator: Operator
) -> None:
    await k8s.post(TSG_URL, json=group())
    await eventually(lambda: ready(k8s, "rl-a"), what="Ready status")
    lease = await hold(scheduler, "rl-a", "trainer")
    await eventually(
        lambda: (stored(k8s, "rl-a") or {}).get("status", {}).get("holder") == "trainer",
        what="holder in status",
    )

    await k8s.delete(f"{TSG_URL}/rl-a")
    await eventually(
        lambda: (stored(k8s, "rl-a") or {}).get("status", {}).get("phase") == "Deleting",
        what="phase Deleting",
    )
    await asyncio.sleep(0.5)  # several delete-handler retries happen meanwhile
    body = stored(k8s, "rl-a")
    assert body is not None
    assert "rlslice.dev/finalizer" in body["metadata"]["finalizers"]
    assert await scheduler_group(scheduler, "rl-a") is not None

    await release(scheduler, "rl-a", "trainer", lease)
    await eventually(lambda: stored(k8s, "rl-a") is None, what="object gone")
    assert await scheduler_group(scheduler, "rl-a") is None


@pytest.mark.parametrize("delete_timeout", [1.0])
async def test_a_holder_that_never_yields_is_forced_out_after_the_timeout(
    k8s: kmock.KubernetesEmulator, scheduler: Scheduler, operator: Operator
) -> None:
    await k8s.post(TSG_URL, json=group())
    await eventually(lambda: ready(k8s, "rl-a"), what="Ready status")
    await hold(scheduler, "rl-a", "stubborn")
    started = asyncio.get_running_loop().time()
    await k8s.delete(f"{TSG_URL}/rl-a")
    await eventually(lambda: stored(k8s, "rl-a") is None, what="object gone")
    assert asyncio.get_running_loop().time() - started >= 1.0
    assert await scheduler_group(scheduler, "rl-a") is None
