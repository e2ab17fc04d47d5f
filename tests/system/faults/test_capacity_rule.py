"""The scheduler's registration-time capacity rule (`rlslice.scheduler.core.capacity`), pure.

Cases (table): a job that declares nothing is never refused; it fits beside the others
with the reserve; one byte too many is refused, naming the field, the job, the group and
the node; the tightest node decides; nodes of unknown memory are not counted; the job's
own old declaration is not counted twice.
"""

from __future__ import annotations

import pytest

from rlslice.scheduler.core.capacity import register_refusal

GiB = 1 << 30


@pytest.mark.parametrize(
    ("device_bytes", "others", "capacity", "reserve", "refused_on"),
    [
        (0, {"a": 100 * GiB}, {"n1": 1}, GiB, None),
        (4 * GiB, {"a": 4 * GiB}, {"n1": 9 * GiB}, GiB, None),
        (4 * GiB + 1, {"a": 4 * GiB}, {"n1": 9 * GiB}, GiB, "n1"),
        (4 * GiB, {"a": 4 * GiB}, {"n1": 100 * GiB, "n2": 8 * GiB}, GiB, "n2"),
        (4 * GiB, {"a": 4 * GiB}, {}, GiB, None),
        (4 * GiB, {"x": 50 * GiB}, {"n1": 5 * GiB}, GiB, None),
    ],
)  # fmt: skip
def test_a_registration_is_refused_only_when_parking_every_job_would_not_fit(
    device_bytes: int,
    others: dict[str, int],
    capacity: dict[str, int],
    reserve: int,
    refused_on: str | None,
) -> None:
    reason = register_refusal("g", "x", device_bytes, others, capacity, reserve)
    if refused_on is None:
        assert reason is None
    else:
        assert reason is not None
        assert reason.startswith("device_bytes: job 'x'")
        assert f"group 'g' on node {refused_on}:" in reason
        assert "host memory exhausted" in reason
        assert "\n" not in reason
