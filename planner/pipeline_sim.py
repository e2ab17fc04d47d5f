"""A discrete-event simulator of one RL loop: generators, a token queue, a trainer.

Two modes:

- `sequential`: a strict barrier. All generators produce one batch with the current
  weights, the trainer trains on it, the new weights are published, repeat. No lag, but
  generators idle while the trainer works and the trainer idles during generation.
- `bounded_async`: generators keep producing with the last published weights into a
  queue measured in tokens (a count of records says little: two records can differ in
  length a hundredfold). A generator may start a rollout only while the queue holds fewer
  than `max_queue_tokens` (backpressure: overload becomes observable waiting instead of
  unbounded memory); the trainer drops rollouts older than `max_policy_lag` versions and
  publishes every `sync_every_updates` updates.

Importance weights are modelled, not computed: a rollout `lag` versions old gets a
log-ratio drawn from N(0, (lag_drift * lag)^2), so fresher data gives a higher normalised
ESS. Rankings of profiles are observations of this model, not invariants.
Everything is deterministic for a given `seed`; time is simulated, nothing sleeps.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from rlslice._errors import InvalidArgumentError
from rlslice.planner import _checks
from rlslice.planner.pipeline import effective_sample_size

Mode = Literal["sequential", "bounded_async"]
MODES: tuple[str, ...] = ("sequential", "bounded_async")


@dataclass(frozen=True)
class PipelineConfig:
    """One simulated RL loop. All durations are simulated seconds."""

    #: "sequential" (strict barrier) or "bounded_async"
    mode: Mode = "sequential"
    duration_seconds: float = 120.0
    #: rollout workers generating in parallel
    generators: int = 8
    rollouts_per_update: int = 8
    #: decode speed of one generator
    generator_tokens_per_second: float = 50.0
    #: response lengths are log-normal with this mean and log-space sigma, capped
    mean_response_tokens: float = 300.0
    response_tokens_sigma: float = 0.6
    max_response_tokens: int = 1536
    trainer_tokens_per_second: float = 300.0
    update_overhead_seconds: float = 1.0
    #: publishing weights to the generators blocks the trainer this long
    sync_seconds: float = 2.0
    #: admission threshold of the token queue (bounded_async)
    max_queue_tokens: int = 7000
    #: rollouts older than this many versions are discarded (bounded_async)
    max_policy_lag: int = 2
    #: publish weights after every this many updates (bounded_async)
    sync_every_updates: int = 1
    #: spread of the modelled log importance ratio per version of lag
    lag_drift: float = 0.35
    seed: int = 0

    def __post_init__(self) -> None:
        _checks.choice("mode", self.mode, MODES)
        _checks.real("duration_seconds", self.duration_seconds, positive=True)
        for key in (
            "generators",
            "rollouts_per_update",
            "max_response_tokens",
            "sync_every_updates",
        ):
            _checks.integer(key, getattr(self, key), minimum=1)
        _checks.integer("max_queue_tokens", self.max_queue_tokens, minimum=1)
        _checks.integer("max_policy_lag", self.max_policy_lag, minimum=0)
        _checks.integer("seed", self.seed)
        for key in (
            "generator_tokens_per_second",
            "mean_response_tokens",
            "trainer_tokens_per_second",
        ):
            _checks.real(key, getattr(self, key), positive=True)
        for key in (
            "response_tokens_sigma",
            "update_overhead_seconds",
            "sync_seconds",
            "lag_drift",
        ):
            _checks.real(key, getattr(self, key), minimum=0)


@dataclass(frozen=True)
class BatchStats:
    """One optimizer update."""

    update: int
    finished_at: float
    rollouts: int
    tokens: int
    mean_lag: float
    max_lag: int
    normalized_ess: float


@dataclass(frozen=True)
class PipelineResult:
    """What a simulated run did."""

    config: PipelineConfig
    updates: int
    trained_tokens: int
    trained_tokens_per_second: float
    generated_rollouts: int
    discarded_rollouts: int
    max_queue_tokens_observed: int
    #: wall seconds during which an idle generator was refused admission
    backpressure_seconds: float
    #: share of the run the trainer spent neither training nor publishing
    trainer_idle_fraction: float
    #: share of the run spent publishing weights
    weight_sync_fraction: float
    batches: tuple[BatchStats, ...]
    #: one row per event: time, queue_tokens, policy_version, published_version
    timeline: tuple[Mapping[str, float], ...]


def result_row(result: PipelineResult) -> dict[str, float | int | str]:
    """One flat row for a summary table."""
    batches = result.batches
    return {
        "mode": result.config.mode,
        "updates": result.updates,
        "trained tokens/s": round(result.trained_tokens_per_second, 2),
        "mean lag": round(sum(b.mean_lag for b in batches) / len(batches), 3) if batches else 0.0,
        "max lag": max((b.max_lag for b in batches), default=0),
        "mean normalized ESS": (
            round(sum(b.normalized_ess for b in batches) / len(batches), 3) if batches else 1.0
        ),
        "max queue tokens": result.max_queue_tokens_observed,
        "backpressure s": round(result.backpressure_seconds, 2),
        "discarded rollouts": result.discarded_rollouts,
        "trainer idle": round(result.trainer_idle_fraction, 3),
    }


@dataclass(frozen=True)
class _Rollout:
    tokens: int
    version: int


@dataclass
class _Run:
    """Mutable bookkeeping of one simulation; never leaves this module."""

    config: PipelineConfig
    lengths: random.Random
    weights: random.Random
    now: float = 0.0
    version: int = 0
    published: int = 0
    queue: deque[_Rollout] = field(default_factory=deque)
    queue_tokens: int = 0
    max_queue: int = 0
    generated: int = 0
    discarded: int = 0
    trained_tokens: int = 0
    train_busy: float = 0.0
    sync_busy: float = 0.0
    backpressure: float = 0.0
    batches: list[BatchStats] = field(default_factory=list)
    timeline: list[Mapping[str, float]] = field(default_factory=list)

    def sample_tokens(self) -> int:
        c = self.config
        sigma = c.response_tokens_sigma
        mu = math.log(c.mean_response_tokens) - sigma * sigma / 2
        return max(1, min(c.max_response_tokens, round(self.lengths.lognormvariate(mu, sigma))))

    def record(self) -> None:
        self.max_queue = max(self.max_queue, self.queue_tokens)
        self.timeline.append(
            {
                "time": self.now,
                "queue_tokens": float(self.queue_tokens),
                "policy_version": float(self.version),
                "published_version": float(self.published),
            }
        )

    def push(self, rollout: _Rollout) -> None:
        self.queue.append(rollout)
        self.queue_tokens += rollout.tokens
        self.generated += 1

    def drop_stale(self) -> None:
        limit = self.config.max_policy_lag
        kept = deque(r for r in self.queue if self.version - r.version <= limit)
        self.discarded += len(self.queue) - len(kept)
        self.queue = kept
        self.queue_tokens = sum(r.tokens for r in kept)

    def take_batch(self) -> list[_Rollout]:
        batch = [self.queue.popleft() for _ in range(self.config.rollouts_per_update)]
        self.queue_tokens -= sum(r.tokens for r in batch)
        return batch

    def finish_update(self, batch: list[_Rollout], finished_at: float) -> None:
        self.version += 1
        lags = [self.version - 1 - r.version for r in batch]
        log_ratios = [self.weights.gauss(0.0, self.config.lag_drift * lag) for lag in lags]
        tokens = sum(r.tokens for r in batch)
        self.trained_tokens += tokens
        self.batches.append(
            BatchStats(
                update=self.version,
                finished_at=finished_at,
                rollouts=len(batch),
                tokens=tokens,
                mean_lag=sum(lags) / len(lags),
                max_lag=max(lags),
                normalized_ess=effective_sample_size(log_ratios, log=True, normalized=True),
            )
        )

    def train_seconds(self, batch: list[_Rollout]) -> float:
        c = self.config
        return (
            c.update_overhead_seconds + sum(r.tokens for r in batch) / c.trainer_tokens_per_second
        )

    def result(self) -> PipelineResult:
        c = self.config
        busy = min(self.train_busy + self.sync_busy, c.duration_seconds)
        return PipelineResult(
            config=c,
            updates=len(self.batches),
            trained_tokens=self.trained_tokens,
            trained_tokens_per_second=self.trained_tokens / c.duration_seconds,
            generated_rollouts=self.generated,
            discarded_rollouts=self.discarded,
            max_queue_tokens_observed=self.max_queue,
            backpressure_seconds=self.backpressure,
            trainer_idle_fraction=1 - busy / c.duration_seconds,
            weight_sync_fraction=min(self.sync_busy, c.duration_seconds) / c.duration_seconds,
            batches=tuple(self.batches),
            timeline=tuple(self.timeline),
        )


def _sequential(run: _Run) -> None:
    c = run.config
    end = c.duration_seconds
    while run.now < end:
        # Generate one batch: rollouts go to the earliest free generator.
        free = [run.now] * c.generators
        heapq.heapify(free)
        finishes = []
        for _ in range(c.rollouts_per_update):
            start = heapq.heappop(free)
            tokens = run.sample_tokens()
            done = start + tokens / c.generator_tokens_per_second
            heapq.heappush(free, done)
            finishes.append((done, _Rollout(tokens, run.published)))
        for done, rollout in sorted(finishes, key=lambda item: item[0]):
            if done > end:
                run.now = end
                return
            run.now = done
            run.push(rollout)
            run.record()
        batch = run.take_batch()
        train = run.train_seconds(batch)
        if run.now + train > end:
            run.train_busy += end - run.now
            return
        run.now += train
        run.train_busy += train
        run.finish_update(batch, run.now)
        run.record()
        sync = min(c.sync_seconds, end - run.now)
        run.sync_busy += sync
        run.now += sync
        run.published = run.version
        run.record()


def _bounded_async(run: _Run) -> None:
    _BoundedAsync(run).run()


class _BoundedAsync:
    """The bounded-async mode: generators and trainer as events on one simulated clock."""

    def __init__(self, run: _Run) -> None:
        self.state = run
        self.c = run.config
        self.end = self.c.duration_seconds
        self.events: list[tuple[float, int, str, _Rollout | None]] = []
        self.sequence = 0
        self.idle_generators = self.c.generators
        self.trainer_free = True
        self.blocked_since: float | None = None
        self.batch: list[_Rollout] = []

    def schedule(self, at: float, kind: str, rollout: _Rollout | None = None) -> None:
        self.sequence += 1
        heapq.heappush(self.events, (at, self.sequence, kind, rollout))

    def admit(self) -> None:
        """Idle generators start a rollout while the queue has room; blocked time is counted."""
        run, c = self.state, self.c
        while self.idle_generators and run.queue_tokens < c.max_queue_tokens:
            self.idle_generators -= 1
            tokens = run.sample_tokens()
            self.schedule(
                run.now + tokens / c.generator_tokens_per_second,
                "rollout",
                _Rollout(tokens, run.published),
            )
        if self.idle_generators and self.blocked_since is None:
            self.blocked_since = run.now
        elif not self.idle_generators and self.blocked_since is not None:
            run.backpressure += run.now - self.blocked_since
            self.blocked_since = None

    def start_training(self) -> None:
        run = self.state
        if not self.trainer_free:
            return
        run.drop_stale()
        if len(run.queue) < self.c.rollouts_per_update:
            return
        self.batch = run.take_batch()
        self.trainer_free = False
        seconds = run.train_seconds(self.batch)
        run.train_busy += min(seconds, self.end - run.now)
        self.schedule(run.now + seconds, "trained")

    def handle(self, kind: str, rollout: _Rollout | None) -> None:
        run, c = self.state, self.c
        if kind == "rollout":
            assert rollout is not None
            self.idle_generators += 1
            run.push(rollout)
        elif kind == "trained":
            run.finish_update(self.batch, run.now)
            if run.version % c.sync_every_updates == 0:
                run.sync_busy += min(c.sync_seconds, self.end - run.now)
                self.schedule(run.now + c.sync_seconds, "published")
            else:
                self.trainer_free = True
        elif kind == "published":
            run.published = run.version
            self.trainer_free = True

    def run(self) -> None:
        run = self.state
        self.admit()
        run.record()
        while self.events and self.events[0][0] <= self.end:
            run.now, _, kind, rollout = heapq.heappop(self.events)
            self.handle(kind, rollout)
            self.start_training()
            self.admit()
            run.record()
        run.now = self.end
        if self.blocked_since is not None:
            run.backpressure += self.end - self.blocked_since


def simulate_pipeline(config: PipelineConfig) -> PipelineResult:
    """Run `config` for `config.duration_seconds` of simulated time."""
    if not isinstance(config, PipelineConfig):
        raise InvalidArgumentError(f"config must be a PipelineConfig, got {type(config).__name__}")
    run = _Run(
        config=config,
        lengths=random.Random(f"{config.seed}:lengths"),
        weights=random.Random(f"{config.seed}:weights"),
    )
    run.record()
    if config.mode == "sequential":
        _sequential(run)
    else:
        _bounded_async(run)
    return run.result()
