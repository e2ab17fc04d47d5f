"""Which waiter-ordering policy a group should use, with the reason. Pure.

`choose_policy` simulates one group's jobs once per candidate policy (each a `Picker`
from the applications layer: the scheduler's own policy code) and recommends:

1. among the policies that keep every job within its slowdown bound, the one with the
   shortest minimum step time (the fastest job's mean cycle), when it beats `fifo`'s by
   at least `MIN_GAIN` (5 %);
2. otherwise `fifo`: the order hardly matters (two jobs, or jobs alike), or the policy
   that would gain slows a job past its bound. The reason says which.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from rlslice._errors import InvalidArgumentError
from rlslice.planner.interleave import InterleaveResult
from rlslice.planner.waiters import Picker

#: Shortening of the minimum step time below which `fifo` stays the recommendation.
MIN_GAIN = 0.05


@dataclass(frozen=True)
class PolicyFigures:
    """One policy simulated for a group."""

    policy: str
    busy_fraction: float
    min_step_seconds: float
    step_seconds: tuple[float, ...]
    """Each job's mean step seconds, in the group's job order."""
    problems: tuple[str, ...] = ()
    """The slowdown bounds the policy breaks."""


@dataclass(frozen=True)
class PolicyChoice:
    """The recommended policy of a group, why, and every policy's figures."""

    policy: str
    reason: str
    figures: tuple[PolicyFigures, ...]


Simulate = Callable[[str, Picker], InterleaveResult]
"""(policy name, its picker) -> the group simulated under it."""


def choose_policy(
    jobs: Sequence[str],
    bounds: Mapping[str, float],
    pickers: Mapping[str, Picker],
    simulate: Simulate,
) -> PolicyChoice:
    """The policy for a group of `jobs` (each with its slowdown bound), from `pickers`
    (which must include `fifo`), each simulated by `simulate`."""
    if "fifo" not in pickers:
        raise InvalidArgumentError("pickers must include fifo, the baseline")
    figures = tuple(_figures(name, simulate(name, pick), bounds) for name, pick in pickers.items())
    fifo = next(f for f in figures if f.policy == "fifo")
    others = [f for f in figures if f.policy != "fifo" and f.min_step_seconds > 0]
    if fifo.min_step_seconds <= 0 or not others:
        return PolicyChoice("fifo", "fifo: no job completed a step to compare", figures)
    best = min(others, key=lambda f: (f.min_step_seconds, f.policy))
    gain = 1 - best.min_step_seconds / fifo.min_step_seconds
    allowed = [f for f in others if not f.problems]
    if gain < MIN_GAIN:
        return PolicyChoice(
            "fifo",
            f"fifo: the order hardly matters here (best other, {best.policy}, changes the "
            f"min step by {gain:+.1%})",
            figures,
        )
    if best.problems:
        fallback = min(allowed, key=lambda f: f.min_step_seconds) if allowed else None
        if fallback is None or 1 - fallback.min_step_seconds / fifo.min_step_seconds < MIN_GAIN:
            return PolicyChoice(
                "fifo",
                f"fifo: {best.policy} would shorten the min step {gain:.0%} but "
                f"{'; '.join(best.problems)}",
                figures,
            )
        best = fallback
        gain = 1 - best.min_step_seconds / fifo.min_step_seconds
    slowest = max(
        (b / a for a, b in zip(fifo.step_seconds, best.step_seconds, strict=True) if a > 0),
        default=1.0,
    )
    return PolicyChoice(
        best.policy,
        f"{best.policy}: min step {best.min_step_seconds:.1f} s vs fifo "
        f"{fifo.min_step_seconds:.1f} s ({-gain:+.0%}), busy {best.busy_fraction:.2f} vs "
        f"{fifo.busy_fraction:.2f}, no job slower than {slowest:.2f}x its fifo step",
        figures,
    )


def _figures(name: str, result: InterleaveResult, bounds: Mapping[str, float]) -> PolicyFigures:
    return PolicyFigures(
        policy=name,
        busy_fraction=result.sliced_busy_fraction,
        min_step_seconds=result.min_step_seconds,
        step_seconds=tuple(job.step_seconds for job in result.jobs),
        problems=tuple(
            f"{job.name}: slowdown {job.slowdown:.3f}x exceeds its bound {bounds[job.name]:.2f}x"
            for job in result.jobs
            if job.slowdown > bounds.get(job.name, float("inf"))
        ),
    )
