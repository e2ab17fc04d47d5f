"""Pod mutation: `mutate(pod, group, settings)` -> JSON patch, applied with jsonpatch.

| pod                                              | expected                                   |
|--------------------------------------------------|--------------------------------------------|
| no group label                                   | empty patch                                |
| system namespace / configured skip namespace     | empty patch                                |
| bare pod with group and job labels               | env, token ref, volume, mount, selector, toleration |
| already has env, volumes, mounts, nodeSelector   | existing values kept, only missing added   |
| already has every rlslice item                   | empty patch (idempotent)                   |
| no job label, Deployment / Job / bare pod owner  | job derived and labelled                   |
| init containers                                  | get the same env and mount                 |
| group unknown                                    | env only, no node selector                 |
| node selector key with '/'                       | JSON pointer escaped                       |
| TLS CA secret configured                         | CA mounted, RLSLICE_TLS_CA set             |
| group or the job's own backend `sim` (table)     | RLSLICE_SIM_ROOT, RLSLICE_NODE (downward API) |
| sim root outside the socket directory            | its own hostPath volume and mount          |
Invariants (hypothesis): applying the patch twice changes nothing the second time; the
patch only adds.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlslice.operator.mutation import InjectionSettings, job_name_for, mutate

SETTINGS = InjectionSettings(
    scheduler_address="rlslice-scheduler.rlslice.svc:50051",
    agent_socket_dir="/run/rlslice",
    token_secret="rlslice-job-token",
    skip_namespaces=frozenset({"kube-system", "kube-public", "kube-node-lease", "rlslice"}),
)
GROUP = {"spec": {"nodeSelector": {"matchLabels": {"rlslice.dev/pool": "h200", "gpu": "yes"}}}}


def pod(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "trainer-0",
            "namespace": "rl",
            "labels": {"rlslice.dev/group": "rl-a", "rlslice.dev/job": "trainer"},
        },
        "spec": {"containers": [{"name": "main", "image": "trainer:1"}]},
    }
    for key, value in overrides.items():
        section, _, field = key.partition("__")
        body[section][field] = value
    return body


def apply(body: dict[str, Any], group: dict[str, Any] | None = GROUP) -> dict[str, Any]:
    return jsonpatch.apply_patch(body, mutate(body, group, SETTINGS))


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_a_pod_without_the_group_label_is_left_alone() -> None:
    body = pod(metadata__labels={"app": "x"})
    assert mutate(body, GROUP, SETTINGS) == []


@pytest.mark.parametrize("namespace", ["kube-system", "kube-public", "kube-node-lease", "rlslice"])
def test_pods_in_system_namespaces_are_left_alone(namespace: str) -> None:
    body = pod()
    body["metadata"]["namespace"] = namespace
    assert mutate(body, GROUP, SETTINGS) == []


def test_a_bare_labelled_pod_gets_everything() -> None:
    result = apply(pod())
    container = result["spec"]["containers"][0]
    assert env_of(container) == {
        "RLSLICE_JOB": "trainer",
        "RLSLICE_GROUP": "rl-a",
        "RLSLICE_SCHEDULER": "rlslice-scheduler.rlslice.svc:50051",
        "RLSLICE_AGENT_SOCKET": "/run/rlslice/agent.sock",
        "RLSLICE_TOKEN": {"secretKeyRef": {"name": "rlslice-job-token", "key": "token"}},
    }
    assert container["volumeMounts"] == [{"name": "rlslice-agent", "mountPath": "/run/rlslice"}]
    assert result["spec"]["volumes"] == [
        {
            "name": "rlslice-agent",
            "hostPath": {"path": "/run/rlslice", "type": "DirectoryOrCreate"},
        }
    ]
    assert result["spec"]["nodeSelector"] == {"rlslice.dev/pool": "h200", "gpu": "yes"}
    assert result["spec"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert result["metadata"]["labels"]["rlslice.dev/job"] == "trainer"


def test_what_a_pod_already_sets_is_kept_and_only_the_rest_added() -> None:
    body = pod()
    body["spec"]["containers"][0]["env"] = [
        {"name": "RLSLICE_SCHEDULER", "value": "elsewhere:1"},
        {"name": "OTHER", "value": "1"},
    ]
    body["spec"]["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    body["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    body["spec"]["nodeSelector"] = {"gpu": "no", "zone": "a"}
    body["spec"]["tolerations"] = [{"key": "spot", "operator": "Exists"}]
    result = apply(body)
    container = result["spec"]["containers"][0]
    env = env_of(container)
    assert env["RLSLICE_SCHEDULER"] == "elsewhere:1"
    assert env["OTHER"] == "1"
    assert env["RLSLICE_GROUP"] == "rl-a"
    assert [m["name"] for m in container["volumeMounts"]] == ["data", "rlslice-agent"]
    assert [v["name"] for v in result["spec"]["volumes"]] == ["data", "rlslice-agent"]
    assert result["spec"]["nodeSelector"] == {"gpu": "no", "zone": "a", "rlslice.dev/pool": "h200"}
    assert [t["key"] for t in result["spec"]["tolerations"]] == ["spot", "nvidia.com/gpu"]


def test_a_pod_that_has_everything_gets_an_empty_patch() -> None:
    once = apply(pod())
    assert mutate(once, GROUP, SETTINGS) == []


def test_init_containers_get_the_environment_and_the_socket_too() -> None:
    body = pod()
    body["spec"]["initContainers"] = [{"name": "warmup", "image": "trainer:1"}]
    result = apply(body)
    init = result["spec"]["initContainers"][0]
    assert env_of(init)["RLSLICE_JOB"] == "trainer"
    assert init["volumeMounts"][0]["name"] == "rlslice-agent"


@pytest.mark.parametrize(
    ("metadata", "job"),
    [
        (
            {
                "generateName": "sampler-7d9f8c-",
                "labels": {"pod-template-hash": "7d9f8c"},
                "ownerReferences": [
                    {"kind": "ReplicaSet", "name": "sampler-7d9f8c", "controller": True}
                ],
            },
            "sampler",
        ),
        (
            {
                "generateName": "grpo-train-",
                "ownerReferences": [{"kind": "Job", "name": "grpo-train", "controller": True}],
            },
            "grpo-train",
        ),
        (
            {"ownerReferences": [{"kind": "StatefulSet", "name": "Ray_Head", "controller": True}]},
            "ray-head",
        ),
        ({"name": "notebook"}, "notebook"),
        ({"generateName": "adhoc-"}, "adhoc"),
        ({"name": "x" * 80}, "x" * 63),
        ({"name": "___"}, "job"),
    ],
    ids=[
        "deployment",
        "job",
        "statefulset",
        "bare-name",
        "generate-name",
        "too-long",
        "no-letters",
    ],
)
def test_a_missing_job_label_is_derived_from_the_owner_or_the_name(
    metadata: dict[str, Any], job: str
) -> None:
    body = pod()
    body["metadata"] = {"namespace": "rl", "labels": {"rlslice.dev/group": "rl-a"}}
    body["metadata"]["labels"].update(metadata.pop("labels", {}))
    body["metadata"].update(metadata)
    assert job_name_for(body) == job
    result = apply(body)
    assert result["metadata"]["labels"]["rlslice.dev/job"] == job
    assert env_of(result["spec"]["containers"][0])["RLSLICE_JOB"] == job


def test_an_unknown_group_still_gets_the_environment_but_no_node_selector() -> None:
    result = apply(pod(), group=None)
    assert "nodeSelector" not in result["spec"]
    assert env_of(result["spec"]["containers"][0])["RLSLICE_GROUP"] == "rl-a"


def test_node_selector_keys_with_slashes_are_escaped_in_the_pointer() -> None:
    body = pod(spec__nodeSelector={"zone": "a"})
    ops = mutate(body, GROUP, SETTINGS)
    paths = {op["path"] for op in ops}
    assert "/spec/nodeSelector/rlslice.dev~1pool" in paths
    assert "/metadata/labels/rlslice.dev~1job" not in paths  # the pod had a job label


def test_a_tls_ca_secret_is_mounted_and_named_in_the_environment() -> None:
    settings = InjectionSettings(scheduler_address="s:1", tls_ca_secret="rlslice-ca")
    body = pod()
    result = jsonpatch.apply_patch(body, mutate(body, GROUP, settings))
    container = result["spec"]["containers"][0]
    assert env_of(container)["RLSLICE_TLS_CA"] == "/etc/rlslice/scheduler-ca/ca.crt"
    assert "RLSLICE_TOKEN" not in env_of(container)
    assert {
        "name": "rlslice-tls-ca",
        "mountPath": "/etc/rlslice/scheduler-ca",
        "readOnly": True,
    } in (container["volumeMounts"])
    secret_volume = next(v for v in result["spec"]["volumes"] if "secret" in v)
    assert secret_volume["secret"]["secretName"] == "rlslice-ca"


_names = st.from_regex(r"[a-z][a-z0-9]{0,8}", fullmatch=True)


@given(
    env=st.lists(_names, max_size=3, unique=True),
    selector=st.dictionaries(_names, _names, max_size=3),
    containers=st.integers(min_value=1, max_value=3),
    has_volumes=st.booleans(),
)
def test_the_patch_only_adds_and_a_second_pass_adds_nothing(
    env: list[str], selector: dict[str, str], containers: int, has_volumes: bool
) -> None:
    body = pod(spec__nodeSelector=selector)
    body["spec"]["containers"] = [
        {"name": f"c{i}", "env": [{"name": n.upper(), "value": "v"} for n in env]}
        for i in range(containers)
    ]
    if has_volumes:
        body["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    original = copy.deepcopy(body)
    ops = mutate(body, GROUP, SETTINGS)
    assert body == original  # pure: the input is not touched
    assert {op["op"] for op in ops} <= {"add"}
    result = jsonpatch.apply_patch(body, ops)
    assert mutate(result, GROUP, SETTINGS) == []
    for key, value in selector.items():
        assert result["spec"]["nodeSelector"][key] == value


SIM_ENV = {
    "RLSLICE_SIM_ROOT": "/run/rlslice/sim",
    "RLSLICE_NODE": {"fieldRef": {"fieldPath": "spec.nodeName"}},
}


@pytest.mark.parametrize(
    ("group", "sim"),
    [
        ({"spec": {"backend": "sim"}}, True),
        ({"spec": {"backend": "cuda"}}, False),
        ({"spec": {}}, False),
        (None, False),
        ({"spec": {"backend": "cuda", "jobs": [{"name": "trainer", "backend": "sim"}]}}, True),
        ({"spec": {"backend": "sim", "jobs": [{"name": "trainer", "backend": "app"}]}}, False),
        ({"spec": {"backend": "sim", "jobs": [{"name": "trainer", "priority": 3}]}}, True),
        ({"spec": {"backend": "cuda", "jobs": [{"name": "other", "backend": "sim"}]}}, False),
    ],
    ids=[
        "group-sim",
        "group-cuda",
        "group-default",
        "group-unknown",
        "job-overrides-to-sim",
        "job-overrides-away-from-sim",
        "job-entry-without-backend",
        "another-jobs-override",
    ],
)
def test_jobs_on_the_sim_backend_learn_where_the_emulated_devices_are(
    group: dict[str, Any] | None, sim: bool
) -> None:
    result = apply(pod(), group)
    env = env_of(result["spec"]["containers"][0])
    if sim:
        assert {k: env[k] for k in SIM_ENV} == SIM_ENV
    else:
        assert not set(SIM_ENV) & set(env)
    # /run/rlslice/sim lies inside the socket mount: no volume of its own.
    assert [v["name"] for v in result["spec"]["volumes"]] == ["rlslice-agent"]


def test_a_sim_root_outside_the_socket_directory_is_mounted_on_its_own() -> None:
    settings = InjectionSettings(scheduler_address="s:1", sim_root="/dev/shm/rlslice-sim")
    body = pod()
    result = jsonpatch.apply_patch(body, mutate(body, {"spec": {"backend": "sim"}}, settings))
    container = result["spec"]["containers"][0]
    assert env_of(container)["RLSLICE_SIM_ROOT"] == "/dev/shm/rlslice-sim"
    assert {"name": "rlslice-sim", "mountPath": "/dev/shm/rlslice-sim"} in container["volumeMounts"]
    assert {
        "name": "rlslice-sim",
        "hostPath": {"path": "/dev/shm/rlslice-sim", "type": "DirectoryOrCreate"},
    } in result["spec"]["volumes"]
    assert mutate(result, {"spec": {"backend": "sim"}}, settings) == []  # idempotent
