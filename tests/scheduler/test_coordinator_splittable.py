"""Which declared parts the coordinator passes to the planner (issue 26): only those of
jobs whose backend's agents split a job into parts (`sim`, `app`); a `cuda` or
`cuda-checkpoint` job moves whole processes, whatever it declared."""

from __future__ import annotations

from rlslice.config import GroupSpec, JobSpec, MoveClass, StatePart
from rlslice.scheduler.coordinator import PARTIAL_BACKENDS, _splittable_parts

PARTS = (
    StatePart(tag="kv_cache", bytes=1 << 20, move_class=MoveClass.DISCARD),
    StatePart(tag="weights", bytes=1 << 20, move_class=MoveClass.OFFLOAD),
)


def test_app_and_sim_jobs_move_by_parts_and_process_backends_move_whole() -> None:
    spec = GroupSpec(
        name="g",
        backend="sim",
        jobs=(
            JobSpec(name="sim-job", parts=PARTS),
            JobSpec(name="app-job", backend="app", parts=PARTS),
            JobSpec(name="cuda-job", backend="cuda", parts=PARTS),
            JobSpec(name="ckpt-job", backend="cuda-checkpoint", parts=PARTS),
            JobSpec(name="plain-job", backend="app"),
        ),
    )
    assert _splittable_parts(spec) == {"sim-job": PARTS, "app-job": PARTS}


def test_a_job_inherits_its_groups_backend_when_it_names_none() -> None:
    spec = GroupSpec(name="g", backend="app", jobs=(JobSpec(name="j", parts=PARTS),))
    assert _splittable_parts(spec) == {"j": PARTS}
    whole = GroupSpec(name="g", backend="cuda", jobs=(JobSpec(name="j", parts=PARTS),))
    assert _splittable_parts(whole) == {}
    assert {"sim", "app"} == PARTIAL_BACKENDS
