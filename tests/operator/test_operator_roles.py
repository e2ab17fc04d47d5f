"""The operator's roles (the chart runs the controller and the webhook as two Deployments),
with the real kopf runtime against kmock.

Case matrix:
- role webhook: admission answers with the group's node selector (the groups index is
  loaded), yet the group never reaches the scheduler and the TimeSliceGroup is never
  written (no finalizer, no status): several replicas can run side by side;
- role controller: the group reaches the scheduler and turns Ready, and nothing listens on
  the webhook port.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import aiohttp
import jsonpatch
import kmock
import pytest

from rlslice.operator.settings import Role

from .conftest import TSG_URL, Operator, Scheduler, eventually
from .test_operator_kmock import group, ready, scheduler_group

pytestmark = pytest.mark.timeout(60)


def review(namespace: str = "rl") -> dict[str, Any]:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "sampler-",
            "namespace": namespace,
            "labels": {"rlslice.dev/group": "rl-a"},
        },
        "spec": {"containers": [{"name": "main", "image": "sampler:1"}]},
    }
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "review-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": f"system:serviceaccount:{namespace}:default"},
            "object": pod,
            "dryRun": False,
        },
    }


async def admit(operator: Operator, body: dict[str, Any]) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{operator.webhook_url}/inject", json=body) as response,
    ):
        assert response.status == 200
        answer: dict[str, Any] = (await response.json())["response"]
        return answer


class TestTheWebhookRole:
    @pytest.fixture
    def operator_role(self) -> Role:
        return "webhook"

    async def test_it_admits_pods_with_the_group_and_never_writes_the_group(
        self, k8s: kmock.KubernetesEmulator, scheduler: Scheduler, operator: Operator
    ) -> None:
        await k8s.post(
            TSG_URL, json=group(nodeSelector={"matchLabels": {"gpu": "h200"}}, namespaces=["rl"])
        )

        async def selected() -> dict[str, Any] | None:
            body = review()
            try:
                answer = await admit(operator, body)
            except aiohttp.ClientConnectionError:
                return None  # kopf opens the webhook port shortly after it reports ready
            if "patch" not in answer:
                return None
            ops = json.loads(base64.b64decode(answer["patch"]))
            pod = jsonpatch.apply_patch(body["request"]["object"], ops)
            return pod if pod["spec"].get("nodeSelector") == {"gpu": "h200"} else None

        pod = await eventually(selected, what="the group's node selector injected")
        assert pod["metadata"]["labels"]["rlslice.dev/job"] == "sampler"
        assert await scheduler_group(scheduler, "rl-a") is None
        writes = [
            r for r in k8s if r.method in ("PATCH", "PUT") and "timeslicegroups" in str(r.url)
        ]
        assert writes == []


class TestTheControllerRole:
    @pytest.fixture
    def operator_role(self) -> Role:
        return "controller"

    async def test_it_reconciles_groups_and_serves_no_webhook(
        self, k8s: kmock.KubernetesEmulator, scheduler: Scheduler, operator: Operator
    ) -> None:
        await k8s.post(TSG_URL, json=group())
        await eventually(lambda: ready(k8s, "rl-a"), what="Ready status")
        assert await scheduler_group(scheduler, "rl-a") is not None
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.ClientConnectionError):
                await session.post(f"{operator.webhook_url}/inject", json=review())
