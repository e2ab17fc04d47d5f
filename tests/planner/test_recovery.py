"""Checkpoints and the recovery drill.

Cases: a resume from a complete checkpoint matches the uninterrupted run exactly, for
several seeds and split points; a weights-only resume does not; the manifest copies the
random state (numpy and stdlib) without advancing the generator, and restoring it repeats
the same draws; manifest fields as a flat row; refusals (published ahead of current,
unknown fields, bools, a non-generator rng).
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from rlslice.planner import checkpoint_as_dict, make_checkpoint, recovery_drill
from rlslice.planner.recovery import restore_rng_state


@pytest.mark.parametrize(("seed", "before", "after"), [(12016, 8, 8), (1, 1, 30), (7, 20, 3)])
def test_a_complete_checkpoint_resumes_exactly_and_weights_alone_do_not(
    seed: int, before: int, after: int
) -> None:
    drill = recovery_drill(seed=seed, before=before, after=after)
    assert drill.exact_match
    assert drill.resumed == drill.uninterrupted
    assert not drill.broken_match
    assert drill.broken_resume.optimizer_step == after  # a new run, not a continuation
    assert drill.uninterrupted.optimizer_step == before + after


def test_the_manifest_copies_a_numpy_generator_state_without_advancing_it() -> None:
    rng = np.random.default_rng(12016)
    _ = rng.integers(0, 10_000, size=8)
    manifest = make_checkpoint(
        optimizer_step=3, current_version=3, published_version=3, dataset_cursor=8, rng=rng
    )
    expected = rng.integers(0, 10_000, size=4).tolist()
    replay = np.random.default_rng(0)
    restore_rng_state(replay, manifest.rng_state)
    assert replay.integers(0, 10_000, size=4).tolist() == expected


def test_the_manifest_copies_a_stdlib_random_state() -> None:
    rng = random.Random(5)
    manifest = make_checkpoint(
        optimizer_step=1, current_version=1, published_version=0, dataset_cursor=2, rng=rng
    )
    expected = [rng.random() for _ in range(3)]
    replay = random.Random()
    restore_rng_state(replay, manifest.rng_state)
    assert [replay.random() for _ in range(3)] == expected


def test_checkpoint_as_dict_is_one_flat_row_with_the_notebook_columns() -> None:
    manifest = make_checkpoint(
        optimizer_step=3,
        current_version=3,
        published_version=3,
        dataset_cursor=8,
        rng=np.random.default_rng(1),
        tokenizer_version="qwen3-tok-1",
    )
    row = checkpoint_as_dict(manifest)
    assert {
        "optimizer_step",
        "current_version",
        "published_version",
        "dataset_cursor",
        "rng_state",
        "lr_scheduler_step",
        "tokenizer_version",
    } <= set(row)
    assert row["lr_scheduler_step"] == 3
    assert row["tokenizer_version"] == "qwen3-tok-1"


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"published_version": 4}, "published_version"),
        ({"optimizer_step": True}, "optimizer_step"),
        ({"dataset_cursor": -1}, "dataset_cursor"),
        ({"rng": object()}, "rng"),
        ({"colour": "blue"}, "unknown checkpoint fields: colour"),
    ],
)
def test_a_bad_checkpoint_is_refused_naming_the_argument(
    kwargs: dict[str, object], argument: str
) -> None:
    base: dict[str, object] = {
        "optimizer_step": 3,
        "current_version": 3,
        "published_version": 3,
        "dataset_cursor": 8,
        "rng": random.Random(0),
    }
    with pytest.raises(ValueError, match=argument):
        make_checkpoint(**{**base, **kwargs})  # type: ignore[arg-type]


@pytest.mark.parametrize(("before", "after"), [(0, 8), (8, 0), (True, 8)])
def test_a_drill_needs_at_least_one_step_each_side(before: int, after: int) -> None:
    with pytest.raises(ValueError, match=r"before|after"):
        recovery_drill(seed=1, before=before, after=after)
