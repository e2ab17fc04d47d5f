"""The waiter-ordering policies in the simulator: issue 27's three-jobs figures.

Cases: the simulator's picker is the scheduler's own `pick` (stage serves a train before
an earlier rollout, an aged waiter first, lrs a never-served job first); on the three-jobs
scenario, for several jitter seeds, stage shortens the minimum step time by at least 15 %
against fifo, keeps the group at least 85 % busy and slows no job more than 1.3x; lrs
is no better than fifo there (documented); `rlslice simulate --policy fifo,lrs,stage
--json` prints each policy's busy fraction, min step and per-job step times side by
side; an unknown policy or a policy named twice exits 2 naming it; a YAML scenario
declares its phase kinds; a cycle whose last GPU phase runs straight into the next
cycle's GPU phase still counts as a step.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rlslice._errors import InvalidArgumentError
from rlslice.apps.cli import main
from rlslice.apps.shared.sim_policies import phase_table, picker
from rlslice.planner.interleave import InterleaveResult
from rlslice.planner.scenarios import scenario_from_mapping, three_jobs_scenario
from rlslice.planner.waiters import QueuedJob

KINDS = phase_table({"rollout": "rollout", "train": "train"})


def waiter(job: str, ticket: int, since: float, phase: str, **kw: object) -> QueuedJob:
    fields: dict[str, object] = {
        "priority": 0,
        "weight": 1.0,
        "held_seconds": 0.0,
        "last_served_at": None,
        "last_granted_at": None,
    }
    fields.update(kw)
    return QueuedJob(job, ticket, since, phase, **fields)  # type: ignore[arg-type]


def test_stage_serves_a_waiting_train_before_an_earlier_rollout() -> None:
    queue = [waiter("a", 1, 0.0, "rollout"), waiter("b", 2, 5.0, "train")]
    assert picker("fifo", KINDS)(queue, 10.0) == "a"
    assert picker("stage", KINDS)(queue, 10.0) == "b"


def test_stage_serves_a_waiter_past_the_aging_bound_first() -> None:
    queue = [waiter("a", 1, 0.0, "rollout"), waiter("b", 2, 5.0, "train")]
    assert picker("stage", KINDS, stage_aging_seconds=60.0)(queue, 61.0) == "a"


def test_stage_without_declared_phases_is_arrival_order() -> None:
    queue = [waiter("a", 1, 0.0, "rollout"), waiter("b", 2, 5.0, "train")]
    assert picker("stage")(queue, 10.0) == "a"


def test_lrs_serves_the_least_recently_served_job_first() -> None:
    queue = [
        waiter("a", 1, 0.0, "rollout", last_served_at=9.0),
        waiter("b", 2, 1.0, "rollout", last_served_at=3.0),
        waiter("c", 3, 2.0, "rollout"),
    ]
    assert picker("lrs")(queue, 10.0) == "c"
    assert picker("lrs")(queue[:2], 10.0) == "b"


def test_an_unknown_policy_has_no_picker() -> None:
    with pytest.raises(ValueError, match="random"):
        picker("random")


def _figures(seed: int) -> dict[str, InterleaveResult]:
    scenario = three_jobs_scenario()
    kinds = phase_table(scenario.phase_kinds)
    return {name: scenario.run(policy=name, seed=seed, picker=picker(name, kinds)) for name in (
        "fifo", "lrs", "stage"
    )}  # fmt: skip


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_stage_shortens_the_min_step_by_15_percent_on_three_jobs(seed: int) -> None:
    runs = _figures(seed)
    fifo, stage = runs["fifo"], runs["stage"]
    assert stage.min_step_seconds <= 0.85 * fifo.min_step_seconds
    assert stage.sliced_busy_fraction >= 0.85
    base = {job.name: job.step_seconds for job in fifo.jobs}
    for job in stage.jobs:
        assert job.step_seconds <= 1.3 * base[job.name], job.name
    lrs = runs["lrs"]
    assert lrs.min_step_seconds >= 0.99 * fifo.min_step_seconds


def test_every_job_of_three_jobs_completes_cycles_under_every_policy() -> None:
    for result in _figures(0).values():
        assert all(job.sliced_cycles >= 5 for job in result.jobs)
        assert all(job.step_seconds > job.dedicated_step_seconds for job in result.jobs)


def test_simulate_prints_the_policies_side_by_side_as_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["simulate", "--scenario", "three-jobs", "--policy", "fifo,lrs,stage", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out["policies"]) == ["fifo", "lrs", "stage"]
    for summary in out["policies"].values():
        assert 0.85 <= summary["busy"] <= 1.0
        steps = [job["step_seconds"] for job in summary["jobs"]]
        assert [job["name"] for job in summary["jobs"]] == [
            "rollout-heavy",
            "balanced",
            "train-heavy",
        ]
        assert summary["min_step_seconds"] == min(steps)
    assert out["versus_fifo"]["stage"]["min_step_improvement"] >= 0.15
    assert out["versus_fifo"]["stage"]["max_slowdown"] <= 1.3


def test_simulate_prints_a_table_of_the_policies(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--scenario", "three-jobs", "--policy", "fifo,stage"]) == 0
    out = capsys.readouterr().out
    assert "min step s" in out
    assert out.count("\nfifo ") + out.count("\nstage ") == 2


@pytest.mark.parametrize("value", ["fifo,random", "fifo,fifo"])
def test_simulate_refuses_a_bad_policy_list(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--scenario", "three-jobs", "--policy", value]) == 2
    assert "--policy" in capsys.readouterr().out


def test_a_yaml_scenario_declares_its_phase_kinds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = {
        "group": {"gpu_memory_gib": 80},
        "policy": "stage",
        "phases": {"gen": "rollout", "learn": "train"},
        "jobs": [
            {
                "name": name,
                "phases": [
                    {"name": "gen", "kind": "gpu", "seconds": 30, "device_gib": 20},
                    {"name": "score", "kind": "cpu", "seconds": 20},
                    {"name": "learn", "kind": "gpu", "seconds": 10, "device_gib": 30},
                ],
            }
            for name in ("a", "b", "c")
        ],
    }
    assert scenario_from_mapping(data).phase_kinds == {"gen": "rollout", "learn": "train"}
    path = tmp_path / "jobs.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["simulate", "--jobs", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["policy"] == "stage"
    with pytest.raises(InvalidArgumentError, match=r"phases\.gen"):
        scenario_from_mapping({**data, "phases": {"gen": "decode"}})


def test_a_cycle_ending_in_a_gpu_phase_before_a_gpu_phase_counts_as_a_step() -> None:
    from rlslice.planner.interleave import JobProfile, Phase, simulate_interleaving

    job = JobProfile(
        "solo",
        (Phase("rollout", "gpu", 2.0), Phase("score", "cpu", 1.0), Phase("train", "gpu", 1.0)),
    )
    result = simulate_interleaving(
        [job], gpu_bytes=1, bandwidth_bytes_per_s=1.0, horizon_s=40.0, picker=picker("lrs")
    )
    (outcome,) = result.jobs
    assert outcome.step_seconds == pytest.approx(4.0)
    assert outcome.dedicated_step_seconds == pytest.approx(4.0)
    assert result.min_step_seconds == pytest.approx(4.0)
