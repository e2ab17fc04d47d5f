"""The TimeSliceGroup CRD (charts/rlslice/files/crds/, which templates/crd.yaml renders)
and the examples.

- the CRD is valid Kubernetes (kubernetes-validate strict) and structural: every object
  says its type, no `additionalProperties: false` beside `properties` (forbidden in CRDs)
- printer columns HOLDER, QUEUE, BUSY, BACKEND, AGE, a status subresource, short name tsg
- the example group validates against the CRD's openAPIV3Schema (with unknown fields
  refused, as strict field validation does); typos and bad values fail
- the example workloads are valid Kubernetes and carry the group and job labels
- the example group converts into a scheduler GroupSpec
- status written by the operator's `status_for` validates against the status schema
- conventions: integer seconds and weights (floats refused), headroom a quantity, node and
  namespace label selectors, a Ready printer column; status phase and condition type are
  open strings (a newer operator may add values); a condition needs all five standard
  fields and a CamelCase reason
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from rlslice.config import GroupSpec
from rlslice.operator.reconcile import SchedulerView, status_for
from rlslice.operator.spec import group_spec

ROOT = Path(__file__).resolve().parents[3]
CRD = yaml.safe_load(
    (ROOT / "charts/rlslice/files/crds/timeslicegroups.rlslice.dev.yaml").read_text()
)
EXAMPLES = ROOT / "examples" / "kubernetes"
VERSION = CRD["spec"]["versions"][0]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]


def strict(schema: Any) -> Any:
    """The schema with unknown fields refused (what strict field validation does)."""
    schema = copy.deepcopy(schema)

    def close(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node and node is not schema:
                node.setdefault("additionalProperties", False)
            for value in node.values():
                close(value)
        elif isinstance(node, list):
            for value in node:
                close(value)

    close(schema)
    for key in ("spec", "status"):
        schema["properties"][key]["additionalProperties"] = False
    return schema


VALIDATOR = jsonschema.Draft4Validator(strict(SCHEMA))


def example(name: str) -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / name).read_text())


def test_the_crd_is_valid_kubernetes() -> None:
    kubernetes_validate.validate(CRD, kubernetes_validate.latest_version(), strict=True)


def test_the_crd_schema_is_structural() -> None:
    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            if "properties" in node or "items" in node:
                assert "type" in node, path
            assert not ("properties" in node and "additionalProperties" in node), path
            for key, value in node.items():
                walk(value, f"{path}.{key}")

    walk(SCHEMA, "$")


def test_the_crd_names_printer_columns_status_and_short_name() -> None:
    columns = [
        c["name"].upper() for c in VERSION["additionalPrinterColumns"] if not c.get("priority")
    ]
    assert columns == ["READY", "HOLDER", "QUEUE", "BUSY", "BACKEND", "AGE"]
    (ready,) = [c for c in VERSION["additionalPrinterColumns"] if c["name"] == "Ready"]
    assert ready["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'
    assert VERSION["subresources"] == {"status": {}}
    assert CRD["spec"]["names"]["shortNames"] == ["tsg"]
    assert CRD["spec"]["names"]["plural"] == "timeslicegroups"
    assert CRD["spec"]["group"] == "rlslice.dev"


def test_the_example_group_validates_and_converts() -> None:
    group = example("group.yaml")
    VALIDATOR.validate(group)
    spec = group_spec(group["metadata"]["name"], group["spec"])
    assert spec.node_selector == {"rlslice.dev/pool": "rl"}
    assert [job.name for job in spec.jobs] == ["grpo-trainer", "grpo-sampler"]


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"polcy": "fifo"}, "polcy"),
        ({"policy": "random"}, "random"),
        ({"backend": "gpu"}, "gpu"),
        ({"leaseSeconds": 0}, "0"),
        ({"leaseSeconds": 4000}, "4000"),
        ({"headroom": "-1"}, "-1"),
        ({"headroom": "2 GB"}, "2 GB"),
        ({"headroomBytes": 1024}, "headroomBytes"),
        ({"leaseSeconds": 1.5}, "1.5"),
        ({"maxHoldSeconds": 0.5}, "0.5"),
        ({"jobs": [{"name": "a", "weight": 0.5}]}, "0.5"),
        ({"namespaces": ["Team_A"]}, "Team_A"),
        ({"nodeSelector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}}, "Near"),
        ({"namespaceSelector": {"matchLabels": {"a": 1}}}, "1"),
        ({"jobs": [{"name": "Trainer"}]}, "Trainer"),
        ({"jobs": [{"name": "a", "wieght": 2}]}, "wieght"),
        ({"nodeSelector": {"matchLabels": {"a": 1}}}, "1"),
        ({"nodeSelector": {"gpu": "h200"}}, "gpu"),
        ({"policy": "lru"}, "lru"),
        ({"phases": {"rollout": {"kind": "generate"}}}, "generate"),
        ({"phases": {"rollout": {"expectedSeconds": 5}}}, "kind"),
        ({"phases": {"rollout": {"kind": "rollout", "expectedSeconds": 1.5}}}, "1.5"),
        ({"phases": {"rollout": {"kind": "rollout", "expected": 5}}}, "expected"),
        ({"stageAgingSeconds": 0}, "0"),
        ({"earlyYield": "yes"}, "yes"),
        (
            {"jobs": [{"name": "a", "parts": [{"tag": "kv", "bytes": 1, "moveClass": "evict"}]}]},
            "evict",
        ),
        ({"jobs": [{"name": "a", "parts": [{"tag": "kv"}]}]}, "bytes"),
        ({"jobs": [{"name": "a", "parts": [{"tag": "kv", "bytes": "8 GB"}]}]}, "8 GB"),
        ({"jobs": [{"name": "a", "parts": [{"tag": "", "bytes": 1}]}]}, "''"),
        ({"jobs": [{"name": "a", "parts": [{"tag": "kv", "bytes": 1, "needOrder": -1}]}]}, "-1"),
        ({"jobs": [{"name": "a", "parts": [{"tag": "kv", "bytes": 1, "size": 1}]}]}, "size"),
    ],
)
def test_a_bad_group_spec_is_refused_by_the_schema(change: dict[str, Any], where: str) -> None:
    group = example("group.yaml")
    group["spec"].update(change)
    with pytest.raises(jsonschema.ValidationError) as raised:
        VALIDATOR.validate(group)
    assert where in str(raised.value.message) + str(list(raised.value.path))


def test_a_group_with_phase_kinds_and_an_rl_policy_validates_and_converts() -> None:
    group = example("group.yaml")
    group["spec"].update(
        policy="stage",
        stageAgingSeconds=120,
        earlyYield=False,
        phases={
            "rollout": {"kind": "rollout", "expectedSeconds": 90},
            "train": {"kind": "train"},
            "sync": {"kind": "sync", "expectedSeconds": 2},
        },
    )
    VALIDATOR.validate(group)
    spec = group_spec(group["metadata"]["name"], group["spec"])
    assert spec.policy.value == "stage"
    assert (spec.stage_aging_seconds, spec.early_yield) == (120.0, False)
    assert {name: p.kind.value for name, p in spec.phases.items()} == {
        "rollout": "rollout",
        "train": "train",
        "sync": "sync",
    }
    assert spec.phases["rollout"].expected_seconds == 90.0


def test_a_job_with_state_parts_validates_and_converts() -> None:
    group = example("group.yaml")
    group["spec"].update(
        backend="sim",
        jobs=[
            {"name": "trainer"},
            {
                "name": "sampler",
                "parts": [
                    {"tag": "kv_cache", "bytes": "8Gi", "moveClass": "discard"},
                    {"tag": "weights", "bytes": 4096},
                    {"tag": "optimizer", "bytes": "2G", "moveClass": "keepIfRoom", "needOrder": 1},
                ],
            },
        ],
    )
    VALIDATOR.validate(group)
    spec = group_spec(group["metadata"]["name"], group["spec"])
    parts = spec.jobs[1].parts
    assert [(p.tag, p.bytes, p.move_class.value, p.need_order) for p in parts] == [
        ("kv_cache", 8 * 2**30, "discard", 0),
        ("weights", 4096, "offload", 0),
        ("optimizer", 2_000_000_000, "keep_if_room", 1),
    ]


@pytest.mark.parametrize("name", ["trainer-job.yaml", "sampler-deployment.yaml"])
def test_the_example_workloads_are_valid_and_labelled(name: str) -> None:
    workload = example(name)
    kubernetes_validate.validate(workload, kubernetes_validate.latest_version(), strict=True)
    labels = workload["spec"]["template"]["metadata"]["labels"]
    assert labels["rlslice.dev/group"] == example("group.yaml")["metadata"]["name"]
    assert labels["rlslice.dev/job"] in {j["name"] for j in example("group.yaml")["spec"]["jobs"]}


def test_the_status_the_operator_writes_fits_the_status_schema() -> None:
    spec = GroupSpec(name="rl-h200")
    view = SchedulerView(
        spec=spec, phase="Held", holder="a", queue=("b",), epoch=3, busy_fraction=0.5
    )
    for status in (
        status_for(spec, view, generation=2, now="2025-01-01T00:00:00Z"),
        status_for(None, None, generation=2, now="2025-01-01T00:00:00Z", invalid="spec.x: bad"),
        status_for(
            spec, None, generation=2, now="2025-01-01T00:00:00Z", error="down", deleting=True
        ),
    ):
        VALIDATOR.validate({**example("group.yaml"), "status": status})


def test_a_group_with_selectors_and_quantities_validates() -> None:
    group = example("group.yaml")
    group["spec"].update(
        nodeSelector={
            "matchLabels": {"rlslice.dev/pool": "rl"},
            "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}],
        },
        namespaceSelector={"matchExpressions": [{"key": "team", "operator": "Exists"}]},
        headroom=536870912,
    )
    VALIDATOR.validate(group)


STATUS_CONDITION = {
    "type": "Ready",
    "status": "True",
    "reason": "InScheduler",
    "message": "",
    "lastTransitionTime": "2025-01-01T00:00:00Z",
}


def test_status_fields_a_newer_operator_may_extend_are_not_enums() -> None:
    status = {
        "phase": "Draining",  # a phase this operator does not know yet
        "conditions": [{**STATUS_CONDITION, "type": "Preempting"}],
    }
    VALIDATOR.validate({**example("group.yaml"), "status": status})


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"reason": "in scheduler"}, "in scheduler"),
        ({"reason": ""}, "reason"),
        ({"status": "Yes"}, "Yes"),
        ({"lastTransitionTime": None}, "lastTransitionTime"),
        ({"message": None}, "message"),
    ],
)
def test_a_condition_needs_all_five_standard_fields_and_a_camelcase_reason(
    change: dict[str, Any], where: str
) -> None:
    condition = {**STATUS_CONDITION, **change}
    condition = {k: v for k, v in condition.items() if v is not None}
    with pytest.raises(jsonschema.ValidationError) as raised:
        VALIDATOR.validate({**example("group.yaml"), "status": {"conditions": [condition]}})
    assert where in str(raised.value.message) + str(list(raised.value.path))
