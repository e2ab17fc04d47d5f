"""Registration-time capacity check: refuse a job whose parked state could not fit in host
memory. Pure: the engine passes what the agents reported; the rule is the planner's
`host_capacity_verdict`, so `rlslice plan` and the scheduler agree.

A group's jobs take turns, so at worst every job but the holder sits in host memory at
once, and during a switch the outgoing job is parked while the incoming one is still
there: the check asks for room for *every* job's declared `device_bytes`, plus a reserve,
on every node of the group whose host memory is known.
"""

from __future__ import annotations

from collections.abc import Mapping

from rlslice.planner.capacity import host_capacity_verdict


def register_refusal(
    group: str,
    job: str,
    device_bytes: int,
    others: Mapping[str, int],
    parking_capacity: Mapping[str, int],
    reserve_bytes: int,
) -> str | None:
    """Why `job` (declaring `device_bytes` per node) may not register, or None.

    `others` maps the group's other jobs to their declared device bytes per node;
    `parking_capacity` maps each node whose host memory is known to the bytes it can give
    the group's parked state (free host memory plus what the group parks there already).
    A job that declares nothing (0) is never refused: its size is unknown.
    """
    if device_bytes <= 0:
        return None
    parked = [others[name] for name in sorted(others) if name != job]
    for node in sorted(parking_capacity):
        verdict = host_capacity_verdict(parked, device_bytes, parking_capacity[node], reserve_bytes)
        if not verdict.fits:
            return (
                f"device_bytes: job {job!r} could not be parked in group {group!r} on node "
                f"{node}: {verdict.reason}"
            )
    return None
