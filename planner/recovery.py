"""Semantically complete checkpoints and a recovery drill that proves one.

Restarting from old weights alone is a new run initialised from them, not a continuation:
the Adam moments, the learning-rate schedule, the random streams and the position in
the data are gone. A semantically complete checkpoint carries weights and adapters,
optimizer state, scheduler state, global step and policy version, random-generator
states, dataset position, curriculum state, reward and advantage normalisation,
tokenizer and chat-template versions, verifier and environment versions, decoding
configuration, rollout schema, and the distributed layout with a recipe to rebuild the
queue.

`recovery_drill` trains a tiny deterministic model, stops it, and resumes it twice: from a
complete checkpoint (the result matches the uninterrupted run bit for bit) and from the
weights only (it does not).
"""

from __future__ import annotations

import copy
import hashlib
import math
import random
import struct
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

from rlslice._errors import InvalidArgumentError
from rlslice.planner import _checks


class _BitGenerator(Protocol):
    state: Mapping[str, Any]


class NumpyLikeGenerator(Protocol):
    """A `numpy.random.Generator`, seen structurally (the planner does not import numpy)."""

    @property
    def bit_generator(self) -> _BitGenerator: ...


RandomSource = random.Random | NumpyLikeGenerator


def rng_state(rng: RandomSource) -> object:
    """A deep copy of a generator's state: `random.Random` or a numpy `Generator`."""
    if isinstance(rng, random.Random):
        return rng.getstate()
    bit_generator = getattr(rng, "bit_generator", None)
    if bit_generator is None or not hasattr(bit_generator, "state"):
        raise InvalidArgumentError(
            f"rng must be a random.Random or a numpy Generator, got {type(rng).__name__}"
        )
    return copy.deepcopy(dict(bit_generator.state))


def restore_rng_state(rng: RandomSource, state: object) -> None:
    """Put `state` (from `rng_state`) back into `rng`."""
    if isinstance(rng, random.Random):
        rng.setstate(state)  # type: ignore[arg-type]
    else:
        if not isinstance(state, Mapping):
            raise InvalidArgumentError("rng_state of a numpy Generator must be a mapping")
        rng.bit_generator.state = copy.deepcopy(state)


@dataclass(frozen=True)
class CheckpointManifest:
    """Everything needed to continue a run, not merely to start a new one from its weights."""

    optimizer_step: int
    current_version: int
    published_version: int
    dataset_cursor: int
    rng_state: object
    lr_scheduler_step: int
    weights: tuple[float, ...] = ()
    #: optimizer state by name (Adam: first and second moments)
    optimizer_state: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    curriculum_state: Mapping[str, Any] = field(default_factory=dict)
    reward_normalizer: Mapping[str, float] = field(default_factory=dict)
    tokenizer_version: str = "unrecorded"
    chat_template_version: str = "unrecorded"
    verifier_version: str = "unrecorded"
    environment_version: str = "unrecorded"
    decoding: Mapping[str, Any] = field(default_factory=dict)
    rollout_schema: str = "rollout-v1"
    distributed_layout: str = "single-process"
    queue_recovery: str = "drop in-flight rollouts; regenerate from dataset_cursor"


def make_checkpoint(
    *,
    optimizer_step: int,
    current_version: int,
    published_version: int,
    dataset_cursor: int,
    rng: RandomSource,
    lr_scheduler_step: int | None = None,
    **extra: Any,
) -> CheckpointManifest:
    """A manifest of the run's state; `rng`'s state is copied, the generator is untouched.

    `published_version` may not exceed `current_version` (the generators cannot run weights
    the trainer has not produced). Further fields of `CheckpointManifest` go in `extra`.
    """
    step = _checks.integer("optimizer_step", optimizer_step, minimum=0)
    current = _checks.integer("current_version", current_version, minimum=0)
    published = _checks.integer("published_version", published_version, minimum=0)
    cursor = _checks.integer("dataset_cursor", dataset_cursor, minimum=0)
    if published > current:
        raise InvalidArgumentError(
            f"published_version ({published}) must not exceed current_version ({current})"
        )
    scheduler = (
        step
        if lr_scheduler_step is None
        else _checks.integer("lr_scheduler_step", lr_scheduler_step, minimum=0)
    )
    known = set(CheckpointManifest.__dataclass_fields__)
    unknown = sorted(set(extra) - known)
    if unknown:
        raise InvalidArgumentError("unknown checkpoint fields: " + ", ".join(unknown))
    return CheckpointManifest(
        optimizer_step=step,
        current_version=current,
        published_version=published,
        dataset_cursor=cursor,
        rng_state=rng_state(rng),
        lr_scheduler_step=scheduler,
        **extra,
    )


def checkpoint_as_dict(manifest: CheckpointManifest) -> dict[str, Any]:
    """The manifest as a plain dict (one table row); weights and moments as counts."""
    row = asdict(manifest)
    row["weights"] = len(manifest.weights)
    row["optimizer_state"] = {key: len(value) for key, value in manifest.optimizer_state.items()}
    return row


# A tiny linear model trained with Adam: enough state (moments, schedule, random noise,
# data position) that forgetting any part of it changes the result.
_DIM = 4
_DATASET = 32
_WARMUP = 4
_HORIZON = 64


@dataclass(frozen=True)
class RunSummary:
    """Where a drill run ended: exact comparisons use `weights_sha256`."""

    optimizer_step: int
    policy_version: int
    dataset_cursor: int
    last_loss: float
    weights_sha256: str


@dataclass(frozen=True)
class RecoveryDrill:
    """The three runs of `recovery_drill` and whether the resumes match."""

    uninterrupted: RunSummary
    resumed: RunSummary
    broken_resume: RunSummary
    exact_match: bool
    broken_match: bool


@dataclass(frozen=True)
class _State:
    weights: tuple[float, ...]
    m: tuple[float, ...]
    v: tuple[float, ...]
    step: int
    cursor: int
    loss: float


def _dataset(seed: int) -> list[tuple[tuple[float, ...], float]]:
    source = random.Random(f"{seed}:data")
    target = [source.uniform(-1, 1) for _ in range(_DIM)]
    rows = []
    for _ in range(_DATASET):
        x = tuple(source.uniform(-1, 1) for _ in range(_DIM))
        rows.append((x, sum(a * b for a, b in zip(target, x, strict=True))))
    return rows


def _learning_rate(step: int) -> float:
    if step < _WARMUP:
        return 0.05 * (step + 1) / _WARMUP
    progress = min(1.0, (step - _WARMUP) / (_HORIZON - _WARMUP))
    return 0.05 * 0.5 * (1 + math.cos(math.pi * progress))


def _train(
    state: _State, steps: int, data: list[tuple[tuple[float, ...], float]], noise: random.Random
) -> _State:
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    for _ in range(steps):
        x, y = data[state.cursor % len(data)]
        error = sum(w * xi for w, xi in zip(state.weights, x, strict=True)) - y
        grads = [2 * error * xi + noise.gauss(0.0, 0.01) for xi in x]
        t = state.step + 1
        m = tuple(beta1 * a + (1 - beta1) * g for a, g in zip(state.m, grads, strict=True))
        v = tuple(beta2 * a + (1 - beta2) * g * g for a, g in zip(state.v, grads, strict=True))
        lr = _learning_rate(state.step)
        weights = tuple(
            w - lr * (mi / (1 - beta1**t)) / (math.sqrt(vi / (1 - beta2**t)) + eps)
            for w, mi, vi in zip(state.weights, m, v, strict=True)
        )
        state = _State(weights, m, v, t, state.cursor + 1, error * error)
    return state


def _summary(state: _State) -> RunSummary:
    packed = struct.pack(f"<{len(state.weights)}d", *state.weights)
    return RunSummary(
        optimizer_step=state.step,
        policy_version=state.step,
        dataset_cursor=state.cursor,
        last_loss=state.loss,
        weights_sha256=hashlib.sha256(packed).hexdigest()[:16],
    )


def _fresh(seed: int) -> tuple[_State, random.Random]:
    init = random.Random(f"{seed}:init")
    weights = tuple(init.uniform(-0.1, 0.1) for _ in range(_DIM))
    zeros = (0.0,) * _DIM
    return _State(weights, zeros, zeros, 0, 0, math.nan), random.Random(f"{seed}:noise")


def recovery_drill(*, seed: int, before: int, after: int) -> RecoveryDrill:
    """Train `before` steps, checkpoint, "kill", resume for `after` steps; compare.

    The correct resume restores the whole manifest; the broken one keeps only the weights
    (fresh optimizer moments, schedule from step 0, a new random stream, data from the start).
    """
    _checks.integer("seed", seed)
    first = _checks.integer("before", before, minimum=1)
    second = _checks.integer("after", after, minimum=1)
    data = _dataset(seed)

    state, noise = _fresh(seed)
    uninterrupted = _train(state, first + second, data, noise)

    state, noise = _fresh(seed)
    stopped = _train(state, first, data, noise)
    manifest = make_checkpoint(
        optimizer_step=stopped.step,
        current_version=stopped.step,
        published_version=stopped.step,
        dataset_cursor=stopped.cursor,
        rng=noise,
        weights=stopped.weights,
        optimizer_state={"exp_avg": stopped.m, "exp_avg_sq": stopped.v},
    )
    del stopped, noise  # the process is gone; only the manifest survives

    restored_noise = random.Random()
    restore_rng_state(restored_noise, manifest.rng_state)
    restored = _State(
        manifest.weights,
        manifest.optimizer_state["exp_avg"],
        manifest.optimizer_state["exp_avg_sq"],
        manifest.optimizer_step,
        manifest.dataset_cursor,
        math.nan,
    )
    resumed = _train(restored, second, data, restored_noise)

    fresh, fresh_noise = _fresh(seed)
    weights_only = replace(fresh, weights=manifest.weights)
    broken = _train(weights_only, second, data, fresh_noise)

    return RecoveryDrill(
        uninterrupted=_summary(uninterrupted),
        resumed=_summary(resumed),
        broken_resume=_summary(broken),
        exact_match=_summary(resumed) == _summary(uninterrupted),
        broken_match=_summary(broken) == _summary(uninterrupted),
    )
