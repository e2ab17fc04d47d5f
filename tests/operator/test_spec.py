"""TimeSliceGroup spec -> scheduler GroupSpec.

Cases: a full spec maps every field; an empty spec takes the CRD's defaults; each bad
field fails with InvalidArgumentError naming it in the resource's own (camelCase) terms
(floats where whole seconds or weights belong, bad quantities, node selector requirements
the scheduler cannot match); duplicate job names are refused; quantities convert in both
unit systems (rounded up to a byte); the node label selector becomes the scheduler's label
map; the result round-trips through the wire form unchanged; a job's state parts
(issue 26) become `StatePart`s (quantities, `keepIfRoom`, `needOrder`, the defaults) and a
bad part is refused naming it (`spec.jobs[1].parts[0].moveClass: ...`).
"""

from __future__ import annotations

import pytest

from rlslice._errors import InvalidArgumentError
from rlslice.adapters.wire import group_spec_from_proto, group_spec_to_proto
from rlslice.config import GroupSpec, JobSpec, MoveClass, Policy, StatePart
from rlslice.operator.spec import group_spec


def test_a_full_spec_maps_every_field() -> None:
    spec = group_spec(
        "rl-a",
        {
            "nodeSelector": {
                "matchLabels": {"gpu": "h200"},
                "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}],
            },
            "namespaces": ["rl"],
            "policy": "priority",
            "leaseSeconds": 20,
            "maxHoldSeconds": 600,
            "yieldGraceSeconds": 5,
            "backend": "app",
            "backendOptions": {"chunk": "64Mi"},
            "headroom": "1Ki",
            "jobs": [{"name": "trainer", "priority": 5, "weight": 2, "backend": "cuda"}],
        },
    )
    assert spec == GroupSpec(
        name="rl-a",
        policy=Policy.PRIORITY,
        lease_seconds=20,
        max_hold_seconds=600,
        yield_grace_seconds=5,
        backend="app",
        backend_options={"chunk": "64Mi"},
        headroom_bytes=1024,
        jobs=(JobSpec(name="trainer", priority=5, weight=2.0, backend="cuda"),),
        node_selector={"gpu": "h200", "zone": "a"},
    )


def test_an_empty_spec_takes_the_crd_defaults() -> None:
    spec = group_spec("rl-a", {})
    assert (spec.policy, spec.lease_seconds, spec.yield_grace_seconds, spec.backend) == (
        Policy.FIFO,
        30.0,
        10.0,
        "cuda",
    )
    assert spec.jobs == ()
    assert spec.node_selector == {}


@pytest.mark.parametrize(
    ("name", "spec", "field"),
    [
        ("rl-a", {"policy": "lottery"}, "spec.policy:"),
        ("rl-a", {"leaseSeconds": 0}, "spec.leaseSeconds:"),
        ("rl-a", {"leaseSeconds": 7200}, "spec.leaseSeconds:"),
        ("rl-a", {"maxHoldSeconds": -1}, "spec.maxHoldSeconds:"),
        ("rl-a", {"backend": "gpu"}, "spec.backend:"),
        ("rl-a", {"headroom": -5}, "spec.headroom:"),
        ("rl-a", {"headroom": "2 GB"}, "spec.headroom:"),
        ("rl-a", {"leaseSeconds": 2.5}, "spec.leaseSeconds:"),
        ("rl-a", {"yieldGraceSeconds": 1.5}, "spec.yieldGraceSeconds:"),
        ("rl-a", {"jobs": [{"name": "a", "weight": 0.5}]}, "spec.jobs[0].weight:"),
        (
            "rl-a",
            {"nodeSelector": {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}},
            "spec.nodeSelector.matchExpressions[0]:",
        ),
        (
            "rl-a",
            {
                "nodeSelector": {
                    "matchLabels": {"gpu": "h200"},
                    "matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}],
                }
            },
            "spec.nodeSelector.matchExpressions[0]:",
        ),
        ("rl-a", {"jobs": [{"name": "Trainer"}]}, "spec.jobs[0].name:"),
        ("rl-a", {"jobs": [{"name": "a"}, {"name": "b", "weight": 0}]}, "spec.jobs[1].weight:"),
        ("rl-a", {"jobs": [{"name": "a", "backend": "tpu"}]}, "spec.jobs[0].backend:"),
        ("rl-a", {"jobs": [{"name": "a"}, {"name": "a"}]}, "spec.jobs[1].name:"),
        ("rl-a", {"leaseSeconds": "soon"}, "spec.leaseSeconds:"),
        ("Bad_Name", {}, "metadata.name:"),
        ("rl-a", {"phases": {"rollout": {"kind": "gen"}}}, "spec.phases.rollout.kind:"),
        ("rl-a", {"phases": {"rollout": {}}}, "spec.phases.rollout.kind:"),
        (
            "rl-a",
            {"phases": {"train": {"kind": "train", "expectedSeconds": -1}}},
            "spec.phases.train.expectedSeconds:",
        ),
        (
            "rl-a",
            {"phases": {"train": {"kind": "train", "expectedSeconds": 0.5}}},
            "spec.phases.train.expectedSeconds:",
        ),
        ("rl-a", {"phases": ["rollout"]}, "spec.phases:"),
        ("rl-a", {"stageAgingSeconds": 0}, "spec.stageAgingSeconds:"),
    ],
)
def test_a_bad_field_is_refused_with_its_name(name: str, spec: dict, field: str) -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        group_spec(name, spec)
    message = str(raised.value)
    assert message.startswith(field), message
    assert "\n" not in message


def test_the_spec_round_trips_through_the_wire_form() -> None:
    spec = group_spec("rl-a", {"policy": "fair", "jobs": [{"name": "a", "weight": 3}]})
    assert group_spec_from_proto(group_spec_to_proto(spec)) == spec


def test_a_kind_error_names_the_field_and_the_choices() -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        group_spec("rl-a", {"phases": {"rollout": {"kind": "gen"}}})
    assert str(raised.value) == "spec.phases.rollout.kind: must be one of rollout, train, sync"


def test_phase_kinds_and_rl_policies_round_trip_through_the_wire_form() -> None:
    spec = group_spec(
        "rl-a",
        {
            "policy": "stage",
            "stageAgingSeconds": 60,
            "earlyYield": False,
            "phases": {
                "rollout": {"kind": "rollout", "expectedSeconds": 30},
                "t": {"kind": "train"},
            },
        },
    )
    assert group_spec_from_proto(group_spec_to_proto(spec)) == spec
    lrs = group_spec("rl-a", {"policy": "lrs"})
    assert group_spec_from_proto(group_spec_to_proto(lrs)) == lrs
    assert lrs.early_yield is True


@pytest.mark.parametrize(
    ("quantity", "expected"),
    [
        (0, 0),
        (1536, 1536),
        ("1536", 1536),
        ("2Gi", 2 * 2**30),
        ("1.5Gi", 3 * 2**29),
        ("500M", 500 * 10**6),
        ("1k", 1000),
        ("0.5", 1),  # a byte is the smallest unit: rounded up
    ],
)
def test_a_headroom_quantity_becomes_bytes(quantity: object, expected: int) -> None:
    assert group_spec("rl-a", {"headroom": quantity}).headroom_bytes == expected


def test_a_jobs_parts_become_state_parts() -> None:
    spec = group_spec(
        "rl-a",
        {
            "backend": "sim",
            "jobs": [
                {"name": "trainer"},
                {
                    "name": "actor",
                    "parts": [
                        {"tag": "kv_cache", "bytes": "8Gi", "moveClass": "discard"},
                        {"tag": "weights", "bytes": 1024},
                        {
                            "tag": "optimizer",
                            "bytes": "1.5G",
                            "moveClass": "keepIfRoom",
                            "needOrder": 2,
                        },
                    ],
                },
            ],
        },
    )
    assert spec.jobs[0].parts == ()
    assert spec.jobs[1].parts == (
        StatePart(tag="kv_cache", bytes=8 * 2**30, move_class=MoveClass.DISCARD),
        StatePart(tag="weights", bytes=1024, move_class=MoveClass.OFFLOAD, need_order=0),
        StatePart(
            tag="optimizer",
            bytes=1_500_000_000,
            move_class=MoveClass.KEEP_IF_ROOM,
            need_order=2,
        ),
    )
    assert group_spec_from_proto(group_spec_to_proto(spec)) == spec


def _with_part(**part: object) -> dict:
    return {"jobs": [{"name": "a"}, {"name": "b", "parts": [{"tag": "kv", "bytes": 1}, part]}]}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            _with_part(tag="w", bytes=1, moveClass="keep_if_room"),
            "spec.jobs[1].parts[1].moveClass: must be one of discard, offload, keepIfRoom",
        ),
        (
            _with_part(tag="w", bytes=1, moveClass="evict"),
            "spec.jobs[1].parts[1].moveClass: must be one of discard, offload, keepIfRoom",
        ),
        (
            _with_part(tag="kv", bytes=2),
            "spec.jobs[1].parts[1].tag: 'kv' is listed twice",
        ),
        (
            _with_part(tag="", bytes=1),
            "spec.jobs[1].parts[1].tag: '' must be printable text of 1 to 63 characters",
        ),
        (
            _with_part(tag="x" * 64, bytes=1),
            f"spec.jobs[1].parts[1].tag: {'x' * 63!r} must be printable text of 1 to 63 characters",
        ),
        (
            _with_part(tag="a\tb", bytes=1),
            "spec.jobs[1].parts[1].tag: 'a\\tb' must be printable text of 1 to 63 characters",
        ),
        (_with_part(bytes=1), "spec.jobs[1].parts[1].tag: '' must be printable"),
        (_with_part(tag="w", bytes=-1), "spec.jobs[1].parts[1].bytes: -1 is negative"),
        (
            _with_part(tag="w", bytes="8 GB"),
            "spec.jobs[1].parts[1].bytes: '8 GB' is not a quantity",
        ),
        (_with_part(tag="w", bytes="16Ei"), "spec.jobs[1].parts[1].bytes: '16Ei' is more than"),
        (_with_part(tag="w"), "spec.jobs[1].parts[1].bytes: is required"),
        (_with_part(tag="w", bytes=1, needOrder=-1), "spec.jobs[1].parts[1].needOrder: -1 is not"),
        (_with_part(tag="w", bytes=1, needOrder=2**31), "spec.jobs[1].parts[1].needOrder:"),
        (
            _with_part(tag="w", bytes=1, needOrder=1.5),
            "spec.jobs[1].parts[1].needOrder: 1.5 is not",
        ),
        (_with_part(tag=5, bytes=1), "spec.jobs[1].parts[1].tag: Input should be a valid string"),
        ({"jobs": [{"name": "a", "parts": ["kv"]}]}, "spec.jobs[0].parts[0]: must be a mapping"),
        ({"jobs": [{"name": "a", "parts": {"kv": 1}}]}, "spec.jobs[0].parts: must be a list"),
    ],
)
def test_a_bad_part_is_refused_in_one_line_naming_it(spec: dict, message: str) -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        group_spec("rl-a", spec)
    assert str(raised.value).startswith(message), str(raised.value)
    assert "\n" not in str(raised.value)
