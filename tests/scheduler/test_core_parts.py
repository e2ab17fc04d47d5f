"""Partial moves over tagged parts (`core.parts.plan_parts`), as tables and properties.

Tables: fits with nothing to move; a partial fit (25% needed -> only that much moves);
nothing discardable; a part larger than the host memory left; exact fit; zero-byte parts;
order ties decided by tag, whatever order the parts come in; keep_if_room parts move only
when still short; everything moved and still short.
Properties (hypothesis): every part ends in exactly one list, bytes add up, nothing is
discarded that was not declared `discard`, the plan fits exactly when the freed bytes
cover the need, it moves no part it did not need, and the parts it moved are the first
ones of the documented order.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from rlslice.config import MoveClass, StatePart
from rlslice.scheduler.core.parts import PartPlan, move_order, plan_parts

G = 1 << 30
DIS, OFF, KEEP = MoveClass.DISCARD, MoveClass.OFFLOAD, MoveClass.KEEP_IF_ROOM


def part(tag: str, gib: float, kind: MoveClass = OFF, order: int = 0) -> StatePart:
    return StatePart(tag=tag, bytes=int(gib * G), move_class=kind, need_order=order)


# A trainer: 4 GiB of KV cache it can rebuild, optimizer state needed last, weights first,
# and adapters it would rather keep on the device.
TRAINER = (
    part("kv_cache", 4, DIS),
    part("weights", 8, OFF, order=0),
    part("optimizer", 16, OFF, order=2),
    part("adapters", 4, KEEP),
)


@pytest.mark.parametrize(
    ("parts", "need", "free", "discard", "offload", "keep", "copied", "freed"),
    [
        pytest.param(
            TRAINER,
            10 * G,
            12 * G,
            (),
            (),
            ("kv_cache", "weights", "optimizer", "adapters"),
            0,
            0,
            id="fits-with-nothing-to-move",
        ),
        pytest.param(
            TRAINER,
            2 * G,
            0,
            ("kv_cache",),
            (),
            ("weights", "optimizer", "adapters"),
            0,
            4 * G,
            id="a-discard-part-covers-it-nothing-copied",
        ),
        pytest.param(
            TRAINER,
            12 * G,
            0,
            ("kv_cache",),
            ("optimizer",),
            ("weights", "adapters"),
            16 * G,
            20 * G,
            id="then-the-part-needed-last",
        ),
        pytest.param(
            TRAINER,
            28 * G,
            0,
            ("kv_cache",),
            ("optimizer", "weights"),
            ("adapters",),
            24 * G,
            28 * G,
            id="then-the-next-offload-part",
        ),
        pytest.param(
            TRAINER,
            31 * G,
            0,
            ("kv_cache",),
            ("optimizer", "weights", "adapters"),
            (),
            28 * G,
            32 * G,
            id="keep-if-room-only-when-still-short",
        ),
        pytest.param(
            TRAINER,
            14 * G,
            2 * G,
            ("kv_cache",),
            ("optimizer",),
            ("weights", "adapters"),
            16 * G,
            20 * G,
            id="free-memory-counts-first",
        ),
    ],
)
def test_a_switch_takes_parts_in_the_documented_order_until_the_incoming_job_fits(
    parts: tuple[StatePart, ...],
    need: int,
    free: int,
    discard: tuple[str, ...],
    offload: tuple[str, ...],
    keep: tuple[str, ...],
    copied: int,
    freed: int,
) -> None:
    plan = plan_parts(parts, need, free)
    assert (plan.discard, plan.offload, plan.keep) == (discard, offload, keep)
    assert (plan.bytes_copied, plan.bytes_freed) == (copied, freed)
    assert plan.fits
    assert (plan.short_bytes, plan.reason) == (0, "")


def test_when_a_quarter_of_the_bytes_must_move_only_about_a_quarter_moves() -> None:
    parts = [part(f"layer{i:02}", 1, OFF, order=i) for i in range(16)]
    total = 16 * G
    plan = plan_parts(parts, incoming_need_bytes=total // 4, free_bytes=0)
    assert plan.fits
    assert plan.bytes_copied == total // 4
    assert plan.bytes_copied / total <= 0.30
    # The layers needed last leave; the first ones the job needs stay on the device.
    assert plan.offload == ("layer15", "layer14", "layer13", "layer12")
    assert plan.keep == tuple(f"layer{i:02}" for i in range(12))


def test_a_job_that_declared_nothing_discardable_loses_no_bytes() -> None:
    parts = (
        part("weights", 8, OFF),
        part("optimizer", 16, OFF, order=1),
        part("adapters", 4, KEEP),
    )
    plan = plan_parts(parts, 40 * G, 0)
    assert plan.discard == ()
    assert plan.bytes_copied == plan.bytes_freed == 28 * G
    assert not plan.fits
    assert plan.short_bytes == 12 * G
    assert plan.reason == (
        "short by 12.00 GiB with every part moved: the incoming job needs 40.00 GiB, "
        "0 B free and 28.00 GiB freed"
    )


def test_a_part_larger_than_the_host_memory_left_stays_and_the_next_one_moves() -> None:
    parts = (part("optimizer", 16, OFF, order=1), part("weights", 8, OFF))
    plan = plan_parts(parts, 6 * G, 0, host_free_bytes=10 * G)
    assert plan.fits
    assert (plan.offload, plan.keep) == (("weights",), ("optimizer",))
    assert plan.bytes_copied == 8 * G


def test_a_part_larger_than_the_host_memory_left_is_named_when_nothing_else_fits() -> None:
    parts = (part("optimizer", 16, OFF, order=1), part("weights", 2, OFF))
    plan = plan_parts(parts, 12 * G, 0, host_free_bytes=10 * G)
    assert not plan.fits
    assert (plan.offload, plan.keep) == (("weights",), ("optimizer",))
    assert plan.short_bytes == 10 * G
    assert plan.reason == (
        "short by 10.00 GiB: part 'optimizer' (16.00 GiB) is larger than the host memory "
        "left for it (10.00 GiB)"
    )


def test_a_need_larger_than_the_device_with_everything_moved_does_not_fit() -> None:
    plan = plan_parts(TRAINER, 100 * G, 8 * G)
    assert not plan.fits
    assert plan.moved == ("kv_cache", "optimizer", "weights", "adapters")
    assert plan.short_bytes == 60 * G
    assert plan.reason.startswith("short by 60.00 GiB with every part moved")


def test_an_exact_fit_fits_and_moves_nothing_more() -> None:
    plan = plan_parts(TRAINER, 4 * G + 16 * G + 1, 1)
    assert plan.fits
    assert (plan.discard, plan.offload) == (("kv_cache",), ("optimizer",))
    assert plan.bytes_freed == 20 * G


def test_an_exact_fit_with_free_memory_alone_moves_nothing() -> None:
    plan = plan_parts(TRAINER, 5 * G, 5 * G)
    assert plan == PartPlan((), (), tuple(p.tag for p in TRAINER), 0, 0, True)


def test_zero_byte_parts_are_never_moved() -> None:
    parts = (part("empty_cache", 0, DIS), part("graphs", 0, OFF, order=9), part("weights", 1, OFF))
    plan = plan_parts(parts, G, 0)
    assert plan.fits
    assert (plan.discard, plan.offload) == ((), ("weights",))
    assert plan.keep == ("empty_cache", "graphs")


def test_zero_byte_parts_and_a_zero_need_move_nothing() -> None:
    plan = plan_parts((part("a", 0, DIS), part("b", 0, KEEP)), 0, 0)
    assert plan == PartPlan((), (), ("a", "b"), 0, 0, True)


def test_order_ties_go_by_tag_whatever_order_the_parts_are_listed_in() -> None:
    tied = [part("b", 1, OFF, order=3), part("c", 1, OFF, order=3), part("a", 1, OFF, order=3)]
    forward = plan_parts(tied, 2 * G, 0)
    backward = plan_parts(tied[::-1], 2 * G, 0)
    assert forward.offload == backward.offload == ("a", "b")
    assert forward.keep == ("c",)


def test_move_order_is_class_then_needed_last_then_tag() -> None:
    parts = [
        part("z", 1, KEEP, order=9),
        part("y", 1, OFF, order=0),
        part("x", 1, DIS, order=0),
        part("w", 1, OFF, order=5),
        part("v", 1, DIS, order=1),
    ]
    assert [p.tag for p in move_order(parts)] == ["v", "x", "w", "y", "z"]


@pytest.mark.parametrize(
    ("need", "free", "host", "message"),
    [
        (-1, 0, None, "incoming_need_bytes: must not be negative"),
        (0, -1, None, "free_bytes: must not be negative"),
        (0, 0, -1, "host_free_bytes: must not be negative"),
    ],
)
def test_a_negative_size_is_refused(need: int, free: int, host: int | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_parts(TRAINER, need, free, host_free_bytes=host)


def test_a_tag_listed_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="tag 'weights' is listed twice"):
        plan_parts((part("weights", 1), part("weights", 2)), G, 0)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"tag": "", "bytes": 1}, "tag: '' must be printable text of 1 to 63 characters"),
        ({"tag": "a\nb", "bytes": 1}, "must be printable text"),
        ({"tag": "x" * 64, "bytes": 1}, "must be printable text"),
        ({"tag": "x", "bytes": -1}, "greater than or equal to 0"),
        ({"tag": "x", "bytes": 1, "move_class": "drop"}, "move_class: must be one of"),
        ({"tag": "x", "bytes": 1, "need_order": -1}, "greater than or equal to 0"),
    ],
)
def test_a_bad_part_is_refused_naming_the_field(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        StatePart.model_validate(fields)


def test_a_part_reads_its_move_class_from_plain_text_and_defaults_to_offload() -> None:
    read = StatePart.model_validate({"tag": "kv", "bytes": 1, "move_class": "discard"})
    assert read == StatePart(tag="kv", bytes=1, move_class=MoveClass.DISCARD)
    assert StatePart(tag="w", bytes=1).move_class is MoveClass.OFFLOAD


_parts = st.lists(
    st.builds(
        StatePart,
        tag=st.text("abcdefgh", min_size=1, max_size=3),
        bytes=st.integers(0, 64),
        move_class=st.sampled_from(list(MoveClass)),
        need_order=st.integers(0, 3),
    ),
    max_size=8,
    unique_by=lambda p: p.tag,
)
_size = st.integers(0, 300)


@settings(max_examples=400, deadline=None)
@given(
    parts=_parts,
    need=_size,
    free=_size,
    host=st.none() | _size,
    shuffle=st.randoms(use_true_random=False),
)
def test_every_plan_accounts_for_every_byte_and_moves_only_what_it_needs(
    parts: list[StatePart], need: int, free: int, host: int | None, shuffle: random.Random
) -> None:
    plan = plan_parts(parts, need, free, host_free_bytes=host)
    by_tag = {p.tag: p for p in parts}
    size = {p.tag: p.bytes for p in parts}
    # Every part in exactly one list; bytes add up.
    listed = [*plan.discard, *plan.offload, *plan.keep]
    assert sorted(listed) == sorted(by_tag)
    assert plan.bytes_copied == sum(size[t] for t in plan.offload)
    assert plan.bytes_freed == plan.bytes_copied + sum(size[t] for t in plan.discard)
    # Nothing discarded unless declared so: no declared discard part, no lost bytes.
    assert all(by_tag[t].move_class is MoveClass.DISCARD for t in plan.discard)
    assert all(by_tag[t].move_class is not MoveClass.DISCARD for t in plan.offload)
    # Host room is respected.
    if host is not None:
        assert plan.bytes_copied <= host
    # Fits exactly when the freed bytes cover the need; the shortfall is what is left.
    assert plan.fits == (free + plan.bytes_freed >= need)
    assert plan.short_bytes == max(0, need - free - plan.bytes_freed)
    assert bool(plan.reason) == (not plan.fits)
    # Only what is needed moves: without the last part moved it would not fit.
    assert all(size[t] > 0 for t in plan.moved)
    if plan.fits and plan.moved:
        assert free + plan.bytes_freed - size[plan.moved[-1]] < need
    # The parts moved come first in the documented order (skipping only parts the host
    # had no room for, and zero-byte ones).
    order = [p.tag for p in move_order(parts)]
    ranks = [order.index(t) for t in plan.moved]
    assert ranks == sorted(ranks)
    if plan.moved:
        passed = order[: ranks[-1]]
        skipped = [t for t in passed if t not in plan.moved]
        assert all(
            size[t] == 0 or (host is not None and by_tag[t].move_class is not MoveClass.DISCARD)
            for t in skipped
        )
    # The order the parts were listed in changes nothing but the order of `keep`.
    listed_again = list(parts)
    shuffle.shuffle(listed_again)
    again = plan_parts(listed_again, need, free, host_free_bytes=host)
    assert (again.discard, again.offload, again.fits) == (plan.discard, plan.offload, plan.fits)
    assert sorted(again.keep) == sorted(plan.keep)


@settings(max_examples=200, deadline=None)
@given(parts=_parts, need=_size, free=_size)
def test_a_job_with_nothing_discardable_never_loses_bytes(
    parts: list[StatePart], need: int, free: int
) -> None:
    kept = [p.model_copy(update={"move_class": MoveClass.OFFLOAD}) for p in parts]
    plan = plan_parts(kept, need, free)
    assert plan.discard == ()
    assert plan.bytes_freed == plan.bytes_copied
    assert sum(p.bytes for p in kept if p.tag in plan.keep) + plan.bytes_copied == sum(
        p.bytes for p in kept
    )
