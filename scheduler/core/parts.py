"""Partial moves: which tagged parts of an outgoing job leave the device. Pure.

A job may declare its device state as tagged parts (`rlslice.config.StatePart`), each with
a move class. When an incoming job needs room, `plan_parts` moves only as many bytes as
that job needs to fit, taking parts in this order and stopping as soon as it fits:

1. `discard` parts: freed, never copied. Nothing is cheaper than not copying; the job
   declared it can rebuild them (a KV cache, CUDA graphs).
2. `offload` parts: copied to host memory.
3. `keep_if_room` parts: copied to host only while the incoming job is still short.

Within a class, the part the outgoing job needs last (highest `need_order`) moves first:
it comes back last, so the job can start again before its restore is done. Ties go by tag,
so the plan does not depend on the order the parts were listed in. Zero-byte parts are
never moved (moving them frees nothing). A part is never discarded unless it was declared
`discard`: a job that declared nothing discardable never loses bytes.

With `host_free_bytes` given, a part to copy that is larger than the host memory still
free is skipped (it stays on the device) and the next one is tried.

A plan that does not fit (`fits` false, `reason` says why) is not to be run: the caller
refuses the switch with the reason. Its lists show what moving everything it could would
have done.

`core.moves.plan_switch` calls it for each outgoing job that declared parts, and the
`sim` backend runs the plans; other backends move whole jobs (docs/scheduler.md, "Partial
moves").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rlslice.config import MoveClass, StatePart
from rlslice.units import format_bytes

__all__ = ["MOVE_ORDER", "PartPlan", "move_order", "plan_parts"]

MOVE_ORDER = (MoveClass.DISCARD, MoveClass.OFFLOAD, MoveClass.KEEP_IF_ROOM)
"""The classes in the order a switch takes their parts."""

_RANK = {kind: rank for rank, kind in enumerate(MOVE_ORDER)}


@dataclass(frozen=True, slots=True)
class PartPlan:
    """What a switch does with the outgoing job's parts on one node."""

    discard: tuple[str, ...]
    """Tags freed without a copy, in move order."""
    offload: tuple[str, ...]
    """Tags copied to host (the `offload` parts, then any `keep_if_room` ones), in move
    order."""
    keep: tuple[str, ...]
    """Tags that stay on the device, in the order they were given."""
    bytes_copied: int
    """Bytes the `offload` tags copy to host."""
    bytes_freed: int
    """Device bytes the plan frees: the discarded and the copied parts together."""
    fits: bool
    """Whether the incoming job fits once the plan ran."""
    short_bytes: int = 0
    """Bytes the incoming job still lacks when it does not fit; 0 when it fits."""
    reason: str = ""
    """Why it does not fit, in one line; empty when it fits."""

    @property
    def moved(self) -> tuple[str, ...]:
        """Every tag that leaves the device, in move order (discards first)."""
        return self.discard + self.offload


def move_order(parts: Sequence[StatePart]) -> tuple[StatePart, ...]:
    """`parts` in the order a switch takes them (the module docstring): by move class, then
    needed last first, then by tag."""
    return tuple(sorted(parts, key=lambda p: (_RANK[p.move_class], -p.need_order, p.tag)))


def plan_parts(
    outgoing_parts: Sequence[StatePart],
    incoming_need_bytes: int,
    free_bytes: int,
    *,
    host_free_bytes: int | None = None,
) -> PartPlan:
    """The parts of the outgoing job to discard, offload and keep so that an incoming job
    needing `incoming_need_bytes` of device memory fits beside what stays, with
    `free_bytes` free on the device now; see the module docstring for the order.

    `host_free_bytes`: host memory the copies may take (None: no limit). Raises ValueError
    for a negative size or a tag listed twice.
    """
    _check(outgoing_parts, incoming_need_bytes, free_bytes, host_free_bytes)
    short = incoming_need_bytes - free_bytes
    discard: list[str] = []
    offload: list[str] = []
    freed = copied = 0
    host_left = host_free_bytes
    too_big: tuple[StatePart, int] | None = None  # the first part the host had no room for
    for part in move_order(outgoing_parts):
        if short <= 0:
            break
        if part.bytes == 0:
            continue
        if part.move_class is MoveClass.DISCARD:
            discard.append(part.tag)
        elif host_left is not None and part.bytes > host_left:
            too_big = too_big or (part, host_left)
            continue
        else:
            offload.append(part.tag)
            copied += part.bytes
            if host_left is not None:
                host_left -= part.bytes
        freed += part.bytes
        short -= part.bytes
    moved = {*discard, *offload}
    keep = tuple(p.tag for p in outgoing_parts if p.tag not in moved)
    if short <= 0:
        return PartPlan(tuple(discard), tuple(offload), keep, copied, freed, True)
    return PartPlan(
        tuple(discard),
        tuple(offload),
        keep,
        copied,
        freed,
        False,
        short,
        _reason(short, incoming_need_bytes, free_bytes, freed, too_big),
    )


def _check(parts: Sequence[StatePart], need: int, free: int, host_free: int | None) -> None:
    for name, value in (("incoming_need_bytes", need), ("free_bytes", free)):
        if value < 0:
            raise ValueError(f"{name}: must not be negative, got {value}")
    if host_free is not None and host_free < 0:
        raise ValueError(f"host_free_bytes: must not be negative, got {host_free}")
    seen: set[str] = set()
    for part in parts:
        if part.tag in seen:
            raise ValueError(f"tag {part.tag!r} is listed twice")
        seen.add(part.tag)


def _reason(
    short: int, need: int, free: int, freed: int, too_big: tuple[StatePart, int] | None
) -> str:
    lacking = f"short by {format_bytes(short)}"
    if too_big is not None:
        part, room = too_big
        return (
            f"{lacking}: part {part.tag!r} ({format_bytes(part.bytes)}) is larger than the "
            f"host memory left for it ({format_bytes(room)})"
        )
    return (
        f"{lacking} with every part moved: the incoming job needs {format_bytes(need)}, "
        f"{format_bytes(free)} free and {format_bytes(freed)} freed"
    )
