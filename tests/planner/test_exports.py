"""The planner's public surface is pinned: the notebook's names plus rlslice's additions."""

from __future__ import annotations

import subprocess
import sys

import rlslice.planner

NOTEBOOK_NAMES = {
    "BYTES_PER_GIB",
    "checkpoint_cadence",
    "completion_token_mask",
    "effective_sample_size",
    "human_bytes",
    "ideal_sharded_memory",
    "kv_cache_bytes",
    "model_state_bytes",
    "optimal_checkpoint_interval",
    "peak_memory",
    "pipeline_report",
    "rollout_contract_errors",
    "straggler_report",
    "synchronization_schedule",
    "synchronization_transfer_time",
    "PipelineConfig",
    "checkpoint_as_dict",
    "make_checkpoint",
    "recovery_drill",
    "result_row",
    "simulate_pipeline",
}

EXPECTED = NOTEBOOK_NAMES | {
    "REQUIRED_FIELDS",
    "BatchStats",
    "CapacityPlan",
    "CheckpointCadence",
    "CheckpointManifest",
    "GroupPlan",
    "PlanGroup",
    "InterleaveResult",
    "JobOutcome",
    "JobProfile",
    "PlanJob",
    "ModelState",
    "NodeSpec",
    "PeakMemory",
    "Phase",
    "PipelineReport",
    "PipelineResult",
    "RecoveryDrill",
    "Scenario",
    "StragglerReport",
    "SwitchMarker",
    "SyncSchedule",
    "TimelineInterval",
    "FitVerdict",
    "article_scenario",
    "diagnose_pipeline",
    "host_capacity_verdict",
    "plan_capacity",
    "plan_from_mapping",
    "plot_timeline",
    "queue_growth_per_minute",
    "scenario_from_mapping",
    "simulate_interleaving",
    # phase profiles and the placement advisor
    "Advice",
    "GroupScore",
    "Hardware",
    "Percentiles",
    "ProfiledPhase",
    "SwitchMeasurements",
    "WorkloadProfile",
    "advise",
    "load_profiles",
    "predict_group",
    "profiles_from_events",
    # waiter-ordering policies in the simulator and the advisor (issue 27)
    "Picker",
    "PolicyChoice",
    "QueuedJob",
    "choose_policy",
    "three_jobs_scenario",
}


def test_the_exported_names_are_exactly_the_pinned_ones() -> None:
    assert set(rlslice.planner.__all__) == EXPECTED


def test_every_exported_name_resolves() -> None:
    for name in rlslice.planner.__all__:
        assert getattr(rlslice.planner, name) is not None


def test_importing_the_planner_pulls_in_no_heavy_or_io_framework() -> None:
    # The scheduler imports the planner for host_capacity_verdict; it must stay light.
    code = (
        "import sys, rlslice.planner; "
        "print(sorted(m for m in ('numpy', 'matplotlib', 'yaml', 'pandas', 'grpc', 'torch',"
        " 'prometheus_client', 'kopf', 'kubernetes') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
