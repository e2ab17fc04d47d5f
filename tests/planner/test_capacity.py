"""Capacity checks and the scheduler's host-memory rule.

Cases: host_capacity_verdict fits exactly at the limit and not one byte over, names the
numbers in its reason, refuses bad input naming the argument; a plan computes per-GPU
phase footprints with the course's numbers (peak_memory, ideal sharding), the host
memory to park every job, co-resident pairs and switch seconds; a job too big for a GPU,
and a node short of host memory, each give a verdict with the reason; bad YAML structures
are refused naming the field.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from rlslice.planner import BYTES_PER_GIB, host_capacity_verdict, plan_from_mapping

GIB = BYTES_PER_GIB


def test_a_new_job_that_fits_beside_the_parked_ones_and_the_reserve_is_accepted() -> None:
    verdict = host_capacity_verdict([40 * GIB, 50 * GIB], 20 * GIB, 120 * GIB, 10 * GIB)
    assert verdict.fits
    assert verdict.reason.startswith("fits:")
    assert "120.00 GiB" in verdict.reason


def test_one_byte_over_the_host_memory_is_refused_with_the_numbers() -> None:
    verdict = host_capacity_verdict([40 * GIB, 50 * GIB], 20 * GIB + 1, 120 * GIB, 10 * GIB)
    assert not verdict.fits
    assert verdict.reason.startswith("host memory exhausted:")
    assert "2 parked job(s) 90.00 GiB" in verdict.reason
    assert "120.00 GiB available" in verdict.reason


def test_the_first_job_on_an_empty_node_needs_only_itself_and_the_reserve() -> None:
    assert host_capacity_verdict([], 10, 15, 5).fits
    assert not host_capacity_verdict([], 10, 14, 5).fits


@pytest.mark.parametrize(
    ("args", "argument"),
    [
        (([True], 1, 10, 0), r"parked_bytes\[0\]"),
        (([1], -1, 10, 0), "new_job_bytes"),
        (([1], 1, 10.5, 0), "host_available_bytes"),
        (([1], 1, 10, -1), "reserve_bytes"),
    ],
)
def test_bad_verdict_input_is_refused_naming_the_argument(
    args: tuple[Any, ...], argument: str
) -> None:
    with pytest.raises(ValueError, match=argument):
        host_capacity_verdict(*args)


PLAN: dict[str, Any] = {
    "nodes": [
        {
            "name": "n1",
            "gpus": 4,
            "gpu_memory_gib": 80,
            "host_memory_gib": 512,
            "host_device_gb_per_s": 25,
        }
    ],
    "groups": [
        {
            "name": "rl",
            "nodes": ["n1"],
            "headroom_gib": 2,
            "host_reserve_gib": 32,
            "switch_overhead_s": 0.5,
        }
    ],
    "jobs": [
        {
            "name": "a",
            "group": "rl",
            "total_parameters": 7_000_000_000,
            "kv_cache": {
                "num_sequences": 64,
                "tokens_per_sequence": 4096,
                "num_layers": 32,
                "num_kv_heads": 8,
                "head_dim": 128,
                "element_bytes": 2,
            },
            "buffers_gib": 4,
        },
        {
            "name": "b",
            "group": "rl",
            "phases_gib": {"rollout": [14, 16, 2], "training": [14, 8, 28]},
            "shards": 1,
        },
    ],
}


def test_a_plan_reports_per_gpu_phase_footprints_host_memory_and_switches() -> None:
    plan = plan_from_mapping(PLAN)
    assert plan.fits
    (group,) = plan.groups
    a, b = group.jobs
    # job a over 4 GPUs: rollout 14 GB weights + 32 GiB KV + 4 GiB buffers
    assert a.phase_bytes["rollout"] == -(-(14_000_000_000 + 36 * GIB) // 4)
    assert a.phase_bytes["training"] == -(-(112_000_000_000 + 4 * GIB) // 4)
    assert a.peak_phase == "training"
    # job b is the notebook's phase table, unsharded: training peaks at 50 GiB
    assert (b.peak_phase, b.peak_bytes) == ("training", 50 * GIB)
    assert group.usable_gpu_bytes == 78 * GIB
    needed, available = group.host_bytes["n1"]
    assert needed == 4 * (a.peak_bytes + b.peak_bytes) + 32 * GIB
    assert available == 512 * GIB
    # 27.08 GiB + 50 GiB fit in 78 GiB: the two can be resident together, switches are free
    assert group.coresident_pairs == (("a", "b"),)
    assert group.all_coresident
    assert group.max_switch_seconds == 0.0


def test_jobs_that_cannot_share_a_gpu_get_a_switch_estimate() -> None:
    data = copy.deepcopy(PLAN)
    data["jobs"][0]["shards"] = 1  # job a unsharded: 112 GB + 8 GiB training does not fit either
    data["jobs"][0]["phases_gib"] = {"training": [40]}
    plan = plan_from_mapping(data)
    (group,) = plan.groups
    assert group.coresident_pairs == ()
    expected = 0.5 + (40 * GIB + 50 * GIB) / 25e9
    assert group.switch_seconds[("a", "b")] == pytest.approx(expected)
    assert group.max_switch_seconds == pytest.approx(expected)


def test_a_job_too_big_for_a_gpu_gets_a_verdict_naming_it_and_its_phase() -> None:
    data = copy.deepcopy(PLAN)
    data["jobs"][1]["phases_gib"] = {"training": [70, 10]}
    plan = plan_from_mapping(data)
    assert not plan.fits
    reason = plan.groups[0].verdict.reason
    assert "job b needs 80.00 GiB per GPU in phase training" in reason
    assert "78.00 GiB after headroom" in reason


def test_a_node_short_of_host_memory_gets_a_verdict_naming_the_node() -> None:
    data = copy.deepcopy(PLAN)
    data["nodes"][0]["host_memory_gib"] = 128
    plan = plan_from_mapping(data)
    assert not plan.fits
    assert (
        "node n1: parking every job of the group: host memory exhausted"
        in plan.groups[0].verdict.reason
    )


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(nodes=[]), "nodes must list at least one node"),
        (lambda d: d["nodes"][0].pop("gpu_memory_gib"), r"nodes\[0\].gpu_memory_gib is required"),
        (lambda d: d["nodes"][0].update(gpus=True), r"nodes\[0\].gpus"),
        (lambda d: d["groups"][0].update(nodes=["elsewhere"]), "unknown nodes"),
        (lambda d: d["jobs"][0].update(group="other"), "unknown group 'other'"),
        (lambda d: d["jobs"][0].update(total_parameters=7e9), "total_parameters"),
        (lambda d: d["jobs"][0]["kv_cache"].pop("head_dim"), r"jobs\[0\].kv_cache needs exactly"),
        (lambda d: d["jobs"][0].update(buffers_gib=float("nan")), r"jobs\[0\].buffers_gib"),
        (lambda d: d["jobs"][1].update(shards=0), r"jobs\[1\].shards"),
    ],
)
def test_a_bad_plan_is_refused_naming_the_field(mutate: Any, message: str) -> None:
    data = copy.deepcopy(PLAN)
    mutate(data)
    with pytest.raises(ValueError, match=message):
        plan_from_mapping(data)
