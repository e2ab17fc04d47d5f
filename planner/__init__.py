"""rlslice.planner: the course module's memory and pipeline arithmetic, the interleaving
simulator, capacity checks, phase profiles and the placement advisor. Pure: no grpc, kopf,
kubernetes or torch; numpy and matplotlib are imported only by the functions that need them.

The names below are the notebook's API (seed 001) plus rlslice's own additions; a test
pins them.
"""

from rlslice.planner.advisor import Advice, GroupScore, Hardware, advise, predict_group
from rlslice.planner.capacity import (
    CapacityPlan,
    FitVerdict,
    GroupPlan,
    NodeSpec,
    PlanGroup,
    PlanJob,
    host_capacity_verdict,
    plan_capacity,
    plan_from_mapping,
)
from rlslice.planner.checkpointing import (
    CheckpointCadence,
    checkpoint_cadence,
    optimal_checkpoint_interval,
)
from rlslice.planner.contract import REQUIRED_FIELDS, rollout_contract_errors
from rlslice.planner.diagnose import diagnose_pipeline
from rlslice.planner.interleave import (
    InterleaveResult,
    JobOutcome,
    JobProfile,
    Phase,
    simulate_interleaving,
)
from rlslice.planner.memory import (
    BYTES_PER_GIB,
    ModelState,
    PeakMemory,
    human_bytes,
    ideal_sharded_memory,
    kv_cache_bytes,
    model_state_bytes,
    peak_memory,
)
from rlslice.planner.pipeline import (
    PipelineReport,
    StragglerReport,
    completion_token_mask,
    effective_sample_size,
    pipeline_report,
    queue_growth_per_minute,
    straggler_report,
)
from rlslice.planner.pipeline_sim import (
    BatchStats,
    PipelineConfig,
    PipelineResult,
    result_row,
    simulate_pipeline,
)
from rlslice.planner.policy_advice import PolicyChoice, choose_policy
from rlslice.planner.profile import (
    Percentiles,
    ProfiledPhase,
    SwitchMeasurements,
    WorkloadProfile,
    load_profiles,
)
from rlslice.planner.profile_events import profiles_from_events
from rlslice.planner.recovery import (
    CheckpointManifest,
    RecoveryDrill,
    checkpoint_as_dict,
    make_checkpoint,
    recovery_drill,
)
from rlslice.planner.scenarios import (
    Scenario,
    article_scenario,
    scenario_from_mapping,
    three_jobs_scenario,
)
from rlslice.planner.sync import (
    SyncSchedule,
    synchronization_schedule,
    synchronization_transfer_time,
)
from rlslice.planner.timeline import SwitchMarker, TimelineInterval, plot_timeline
from rlslice.planner.waiters import Picker, QueuedJob

__all__ = [
    "BYTES_PER_GIB",
    "REQUIRED_FIELDS",
    "Advice",
    "BatchStats",
    "CapacityPlan",
    "CheckpointCadence",
    "CheckpointManifest",
    "FitVerdict",
    "GroupPlan",
    "GroupScore",
    "Hardware",
    "InterleaveResult",
    "JobOutcome",
    "JobProfile",
    "ModelState",
    "NodeSpec",
    "PeakMemory",
    "Percentiles",
    "Phase",
    "Picker",
    "PipelineConfig",
    "PipelineReport",
    "PipelineResult",
    "PlanGroup",
    "PlanJob",
    "PolicyChoice",
    "ProfiledPhase",
    "QueuedJob",
    "RecoveryDrill",
    "Scenario",
    "StragglerReport",
    "SwitchMarker",
    "SwitchMeasurements",
    "SyncSchedule",
    "TimelineInterval",
    "WorkloadProfile",
    "advise",
    "article_scenario",
    "checkpoint_as_dict",
    "checkpoint_cadence",
    "choose_policy",
    "completion_token_mask",
    "diagnose_pipeline",
    "effective_sample_size",
    "host_capacity_verdict",
    "human_bytes",
    "ideal_sharded_memory",
    "kv_cache_bytes",
    "load_profiles",
    "make_checkpoint",
    "model_state_bytes",
    "optimal_checkpoint_interval",
    "peak_memory",
    "pipeline_report",
    "plan_capacity",
    "plan_from_mapping",
    "plot_timeline",
    "predict_group",
    "profiles_from_events",
    "queue_growth_per_minute",
    "recovery_drill",
    "result_row",
    "rollout_contract_errors",
    "scenario_from_mapping",
    "simulate_interleaving",
    "simulate_pipeline",
    "straggler_report",
    "synchronization_schedule",
    "synchronization_transfer_time",
    "three_jobs_scenario",
]
