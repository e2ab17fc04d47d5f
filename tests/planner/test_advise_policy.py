"""`rlslice advise` recommends a waiter-ordering policy for each group, with a reason.

Cases: the three-jobs scenario's jobs, allowed to share (bound 3x), get `stage`, the
reason quoting its min step against fifo's; two identical GRPO jobs keep `fifo` because
the order hardly matters; a policy that would gain but slows a job past its bound is not
recommended (the reason says which job); the written group config and TimeSliceGroup
carry the policy and, for stage, the phase kinds, and the group config loads; the
choice itself is pure (`choose_policy` with hand-made simulations).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rlslice.apps.cli import main
from rlslice.config import Policy, load_group_config
from rlslice.planner.interleave import InterleaveResult, JobOutcome
from rlslice.planner.policy_advice import choose_policy
from rlslice.planner.scenarios import THREE_JOBS
from rlslice.planner.waiters import fifo_picker

HARDWARE = ["--gpu-bytes", "80GiB", "--host-bytes", "1TiB", "--rate-gbps", "25"]


def _three_jobs(tmp_path: Path) -> Path:
    profiles = [
        {
            "name": name,
            "phases": [
                {"name": "rollout", "kind": "gpu", "seconds": rollout, "jitter": 0.1},
                {"name": "reward", "kind": "cpu", "seconds": reward, "jitter": 0.1},
                {"name": "train", "kind": "gpu", "seconds": train, "jitter": 0.1},
                {"name": "prepare", "kind": "cpu", "seconds": prepare, "jitter": 0.1},
            ],
            "state_bytes": "40Gi",
            "max_slowdown": 3.0,
        }
        for name, rollout, reward, train, prepare in THREE_JOBS
    ]
    path = tmp_path / "three.yaml"
    path.write_text(yaml.safe_dump({"profiles": profiles}))
    return path


def test_advise_recommends_stage_for_the_three_jobs_with_its_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "groups.yaml"
    tsg = tmp_path / "groups.tsg.yaml"
    argv = ["advise", str(_three_jobs(tmp_path)), *HARDWARE, "--max-group-size", "3"]
    assert main([*argv, "--group-config-out", str(config), "--tsg-out", str(tsg)]) == 0
    out = capsys.readouterr().out
    assert "shared-1 policy: stage: min step" in out
    (group,) = load_group_config(config)
    assert group.policy is Policy.STAGE
    assert {name: p.kind.value for name, p in group.phases.items()} == {
        "rollout": "rollout",
        "train": "train",
    }
    (resource,) = yaml.safe_load_all(tsg.read_text())
    assert resource["spec"]["policy"] == "stage"
    assert resource["spec"]["phases"] == {
        "rollout": {"kind": "rollout"},
        "train": {"kind": "train"},
    }
    assert main([*argv, "--json"]) == 0
    (chosen,) = json.loads(capsys.readouterr().out)["groups"]
    assert sorted(chosen["jobs"]) == ["balanced", "rollout-heavy", "train-heavy"]
    assert chosen["policy"] == "stage"
    assert "vs fifo" in chosen["policy_reason"]


def test_advise_keeps_fifo_for_two_alike_jobs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profiles = [
        {"name": n, "rollout_seconds": 1.05, "cpu_seconds": 2.32, "train_seconds": 0.63}
        for n in ("grpo-a", "grpo-b")
    ]
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump({"profiles": profiles}))
    assert main(["advise", str(path), *HARDWARE, "--json"]) == 0
    (chosen,) = json.loads(capsys.readouterr().out)["groups"]
    assert chosen["policy"] == "fifo"
    assert "hardly matters" in chosen["policy_reason"]


def _result(steps: dict[str, float], slowdowns: dict[str, float]) -> InterleaveResult:
    jobs = tuple(
        JobOutcome(name, 10, 8, 0.4, 100.0, 10.0, slowdowns[name], 100.0, step)
        for name, step in steps.items()
    )
    return InterleaveResult("x", 3600.0, 0.4, 0.9, 10, 5.0, 0, 0, jobs, (), ())


def test_a_policy_that_breaks_a_bound_is_not_recommended() -> None:
    runs = {
        "fifo": _result({"a": 300.0, "b": 310.0}, {"a": 1.1, "b": 1.1}),
        "stage": _result({"a": 200.0, "b": 400.0}, {"a": 1.0, "b": 1.4}),
    }
    choice = choose_policy(
        ("a", "b"),
        {"a": 1.2, "b": 1.2},
        {"fifo": fifo_picker, "stage": fifo_picker},
        lambda name, _: runs[name],
    )
    assert choice.policy == "fifo"
    assert "b: slowdown 1.400x exceeds its bound 1.20x" in choice.reason
    assert [f.policy for f in choice.figures] == ["fifo", "stage"]


def test_a_policy_that_gains_within_the_bounds_is_recommended() -> None:
    runs = {
        "fifo": _result({"a": 300.0, "b": 310.0}, {"a": 1.1, "b": 1.1}),
        "lrs": _result({"a": 298.0, "b": 311.0}, {"a": 1.1, "b": 1.1}),
        "stage": _result({"a": 240.0, "b": 330.0}, {"a": 1.0, "b": 1.15}),
    }
    choice = choose_policy(
        ("a", "b"),
        {"a": 1.2, "b": 1.2},
        dict.fromkeys(runs, fifo_picker),
        lambda name, _: runs[name],
    )
    assert choice.policy == "stage"
    assert "min step 240.0 s vs fifo 300.0 s (-20%)" in choice.reason
