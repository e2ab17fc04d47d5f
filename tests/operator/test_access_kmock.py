"""The namespace access rule at admission, through the webhook role of the real kopf
runtime against kmock.

Case matrix (group rl-a: namespaces [rl], namespaceSelector team=rl):
- a pod of namespace rl (listed) -> allowed, injected;
- a pod of namespace research, labelled team=rl (read from the API) -> allowed;
- a pod of namespace other (neither) -> refused with 403 and a message naming the group
  and the namespace;
- a pod naming a group that does not exist -> refused, naming it;
- a pod whose object names no namespace (as the API server may send a pod being created)
  -> judged by the review's namespace: refused, naming it.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import kmock
import pytest

from rlslice.operator.settings import Role

from .conftest import TSG_URL, Operator, eventually
from .test_operator_kmock import group
from .test_operator_roles import admit, review

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def operator_role() -> Role:
    return "webhook"


@pytest.fixture
def namespaces(k8s: kmock.KubernetesEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    """Namespace objects the webhook reads labels from (through RLSLICE_KUBE_API)."""
    for name, labels in {"research": {"team": "rl"}, "other": {"team": "web"}}.items():
        k8s[f"get /api/v1/namespaces/{name}"] << {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": labels},
        }
    monkeypatch.setenv("RLSLICE_KUBE_API", str(k8s.url))


def review_for(namespace: str, group_name: str = "rl-a") -> dict[str, Any]:
    body = review(namespace)
    body["request"]["object"]["metadata"]["labels"]["rlslice.dev/group"] = group_name
    return body


async def test_only_the_namespaces_a_group_names_may_join_it(
    namespaces: None, k8s: kmock.KubernetesEmulator, operator: Operator
) -> None:
    await k8s.post(
        TSG_URL,
        json=group(namespaces=["rl"], namespaceSelector={"matchLabels": {"team": "rl"}}),
    )

    async def admitted() -> dict[str, Any] | None:
        try:
            answer = await admit(operator, review_for("rl"))
        except OSError:
            return None  # the webhook port opens shortly after kopf reports ready
        return answer if answer["allowed"] and "patch" in answer else None

    await eventually(admitted, what="a pod of a listed namespace admitted")
    selected = await admit(operator, review_for("research"))
    assert selected["allowed"] is True

    refused = await admit(operator, review_for("other"))
    assert refused["allowed"] is False
    assert refused["status"]["code"] == 403
    message = refused["status"]["message"]
    assert "'rl-a'" in message
    assert "'other'" in message

    unknown = await admit(operator, review_for("rl", group_name="rl-missing"))
    assert unknown["allowed"] is False
    assert "'rl-missing'" in unknown["status"]["message"]

    unnamed = review_for("other")
    del unnamed["request"]["object"]["metadata"]["namespace"]
    refused = await admit(operator, unnamed)
    assert refused["allowed"] is False
    assert "'other'" in refused["status"]["message"]
    listed = review_for("rl")
    del listed["request"]["object"]["metadata"]["namespace"]
    answer = await admit(operator, listed)
    assert answer["allowed"] is True
    ops = json.loads(base64.b64decode(answer["patch"]))
    assert "/metadata/namespace" not in {op["path"] for op in ops}  # judged, not changed
