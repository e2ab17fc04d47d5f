"""What a group tells a (re)registering agent it still accounts for (`known_jobs`).

Cases: a registered job, a fenced one, a parked one that left the registry but is still
placed, the holder and every job of the switch in flight are known; a job in none of these
(it left, and its Release was sent) is not, so the agent may drop its copy once its
processes are gone.
"""

from __future__ import annotations

from rlslice.config import GroupSpec
from rlslice.scheduler.core import GroupState, JobRecord, Switch
from rlslice.scheduler.core.placement import place

SPEC = GroupSpec(name="g")


def _record(name: str) -> JobRecord:
    return JobRecord(
        name=name, lease_id=f"l-{name}", secret_hash="h", lease_seconds=5, expires_at=9
    )


def test_registered_fenced_placed_holding_and_switching_jobs_are_known_and_no_other() -> None:
    switch = Switch(
        incoming="in",
        ticket=1,
        waited_since=0.0,
        evict=("out",),
        candidates=("maybe",),
        restore=True,
        epoch=3,
        rollback_epoch=4,
        attempt=1,
        started_at=0.0,
    )
    state = GroupState(
        spec=SPEC,
        jobs={"reg": _record("reg")},
        holder="held",
        placement=place(parked=("placed",)),
        fencing=("fenced",),
        switch=switch,
    )
    assert state.known_jobs() == {"reg", "held", "placed", "fenced", "in", "out", "maybe"}
    assert "left" not in state.known_jobs()


def test_an_empty_group_knows_no_job() -> None:
    assert GroupState(spec=SPEC).known_jobs() == frozenset()
