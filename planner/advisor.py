"""The placement advisor: which jobs should share which group. Pure.

Given phase profiles (`rlslice.planner.profile.WorkloadProfile`), the advisor splits the
jobs into groups of at most `max_group_size` (a job nobody fits beside stays alone) so as
to maximise the fleet's GPU busy fraction: GPU-phase seconds over GPU-seconds of the
groups used. The interleaving simulator scores every candidate group, switch cost
included (`overhead_s + bytes out / rate + bytes in / rate`, per GPU). A group is refused,
with the reason, when:

| bound | refused when |
|---|---|
| device memory | a job's `state_bytes` exceeds the GPU's memory less the headroom |
| host memory (parking) | the states of all the group's jobs (`parking_bytes`) exceed the node's host memory less its reserve |
| slowdown | a job's predicted slowdown exceeds its `max_slowdown` (or the advisor's default) |
| demand | the group's GPU fractions sum above every member's bound: some job must slow down at least that much (found without simulating) |

Search: up to `exhaustive_jobs` jobs, every partition (with memoised group scores, so a
group is simulated once); above, a greedy merge (repeatedly join the two groups whose
union loses the fewest GPU-seconds to waiting and switching, the demand bound pruning
without a simulation) followed by a local search that moves and swaps single jobs
between groups, both within `max_evaluations` simulations. `gap_to_exhaustive` measures
the heuristic against the exhaustive best.

Given `policies` (name -> `Picker`, the scheduler's policy code from the applications
layer), every chosen group of two or more jobs also gets a recommended waiter-ordering
policy with its reason (`rlslice.planner.policy_advice.choose_policy`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import combinations
from typing import Literal

from rlslice._errors import InvalidArgumentError
from rlslice.planner import _checks
from rlslice.planner.interleave import InterleaveResult, simulate_interleaving
from rlslice.planner.memory import human_bytes
from rlslice.planner.policy_advice import choose_policy
from rlslice.planner.profile import WorkloadProfile
from rlslice.planner.waiters import Picker

DEFAULT_MAX_SLOWDOWN = 1.2
#: Simulated cycles of the slowest job in a candidate group (the horizon of a score).
CYCLES_PER_SCORE = 20
MIN_HORIZON_S = 60.0


@dataclass(frozen=True)
class Hardware:
    """One group's GPUs as the simulator sees them: per GPU, and per node for the host."""

    gpu_bytes: int
    """Device memory of one GPU."""
    host_bytes: int
    """Host memory of a node available for parking states."""
    bandwidth_bytes_per_s: float
    """Host<->device copy rate of one GPU with the group's backend (measured)."""
    overhead_s: float = 0.0
    """Seconds a switch costs beyond moving bytes (round trips, freezing)."""
    headroom_bytes: int = 0
    """Device bytes kept free on every GPU."""
    host_reserve_bytes: int = 0
    """Host bytes kept free on every node."""
    backend: str = "sim"

    def __post_init__(self) -> None:
        _checks.integer("gpu_bytes", self.gpu_bytes, minimum=1)
        _checks.integer("host_bytes", self.host_bytes, minimum=0)
        _checks.real("bandwidth_bytes_per_s", self.bandwidth_bytes_per_s, positive=True)
        _checks.real("overhead_s", self.overhead_s, minimum=0)
        _checks.integer("headroom_bytes", self.headroom_bytes, minimum=0)
        _checks.integer("host_reserve_bytes", self.host_reserve_bytes, minimum=0)
        if self.headroom_bytes >= self.gpu_bytes:
            raise InvalidArgumentError("headroom_bytes must be less than gpu_bytes")


@dataclass(frozen=True)
class GroupScore:
    """What the simulator predicts for one candidate group, and the bounds it breaks."""

    jobs: tuple[str, ...]
    busy_fraction: float
    """Predicted GPU busy fraction of the group, time-sliced."""
    slowdowns: tuple[float, ...]
    """Each job's predicted slowdown (in `jobs` order). Not simulated: the group's demand
    (its GPU fractions' sum), a lower bound on the largest slowdown, for every job."""
    switches_per_hour: float
    gpu_seconds_per_hour: float
    """GPU-phase seconds an hour of the group runs."""
    problems: tuple[str, ...] = ()
    """The bounds the group breaks, one sentence each; empty when it is allowed."""
    simulated: bool = True
    """False when a bound refused the group without simulating it (figures are bounds)."""
    policy: str = "fifo"
    """The recommended waiter-ordering policy (chosen groups, when policies were given)."""
    policy_reason: str = ""
    """Why that policy, one sentence; empty when no policy was weighed."""

    @property
    def allowed(self) -> bool:
        """True when the group breaks no bound."""
        return not self.problems

    @property
    def label(self) -> str:
        """`a + b + c`."""
        return " + ".join(self.jobs)


@dataclass(frozen=True)
class Advice:
    """A placement: every job in exactly one group, and what was looked at to choose it."""

    groups: tuple[GroupScore, ...]
    """The chosen groups, best busy fraction first (a job alone is a group of one)."""
    busy_fraction: float
    """Fleet GPU busy fraction of the placement: GPU-phase seconds / GPU-seconds of its groups."""
    dedicated_busy_fraction: float
    """The same with every job alone on its GPUs."""
    candidates: tuple[GroupScore, ...]
    """Every multi-job group scored: allowed first, then refused after a simulation, then
    refused by a bound alone; each by busy fraction."""
    method: Literal["exhaustive", "heuristic"]
    evaluations: int
    """Groups simulated."""
    pruned: int
    """Groups refused by a bound without a simulation."""
    problems: tuple[str, ...] = ()
    """Placement-wide problems (a job that fits no GPU, more groups than available)."""

    @property
    def refused(self) -> tuple[GroupScore, ...]:
        """The candidate groups that break a bound."""
        return tuple(c for c in self.candidates if not c.allowed)


@dataclass
class _Scorer:
    """Scores candidate groups once each (memoised by the set of jobs)."""

    profiles: Mapping[str, WorkloadProfile]
    hardware: Hardware
    max_slowdown: float
    seed: int
    horizon_s: float | None
    cache: dict[frozenset[str], GroupScore] = field(default_factory=dict)
    evaluations: int = 0
    pruned: int = 0

    def bound(self, name: str) -> float:
        own = self.profiles[name].max_slowdown
        return own if own is not None else self.max_slowdown

    def memory_problems(self, names: Sequence[str]) -> list[str]:
        hw = self.hardware
        usable = hw.gpu_bytes - hw.headroom_bytes
        out = [
            f"{n}: device state {human_bytes(self.profiles[n].state_bytes)} exceeds the GPU's "
            f"{human_bytes(usable)} (device memory)"
            for n in names
            if self.profiles[n].state_bytes > usable
        ]
        parking = sum(self.profiles[n].parking_bytes for n in names)
        room = hw.host_bytes - hw.host_reserve_bytes
        if len(names) > 1 and parking > room:
            out.append(
                f"parking {' + '.join(names)} takes {human_bytes(parking)} of host memory; "
                f"the node has {human_bytes(room)} (host memory)"
            )
        return out

    def score(self, names: Sequence[str]) -> GroupScore:
        key = frozenset(names)
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        ordered = tuple(sorted(names))
        profiles = [self.profiles[n] for n in ordered]
        problems = self.memory_problems(ordered)
        demand = sum(p.gpu_fraction for p in profiles)
        if len(ordered) == 1:
            p = profiles[0]
            result = GroupScore(
                ordered,
                p.gpu_fraction,
                (1.0,),
                0.0,
                3600 * p.gpu_fraction,
                tuple(problems),
                simulated=False,
            )
        elif problems or demand > max(self.bound(n) for n in ordered):
            if not problems:
                problems.append(
                    f"demand: the GPU phases need {demand:.0%} of the group, so some job's "
                    f"slowdown is at least {demand:.2f}x, above every bound "
                    f"(max {max(self.bound(n) for n in ordered):.2f}x)"
                )
            self.pruned += 1
            result = GroupScore(
                ordered,
                min(1.0, demand),
                tuple(max(1.0, demand) for _ in ordered),
                0.0,
                3600 * min(1.0, demand),
                tuple(problems),
                simulated=False,
            )
        else:
            result = self._simulate(ordered, profiles)
        self.cache[key] = result
        return result

    def _simulate(self, names: tuple[str, ...], profiles: list[WorkloadProfile]) -> GroupScore:
        self.evaluations += 1
        horizon = self.horizon_s or max(
            MIN_HORIZON_S, CYCLES_PER_SCORE * max(p.cycle_seconds for p in profiles)
        )
        predicted = predict_group(profiles, self.hardware, horizon_s=horizon, seed=self.seed)
        slowdowns = tuple(j.slowdown for j in predicted.jobs)
        problems = tuple(
            f"{n}: slowdown {s:.3f}x exceeds its bound {self.bound(n):.2f}x"
            for n, s in zip(names, slowdowns, strict=True)
            if s > self.bound(n)
        )
        return GroupScore(
            names,
            predicted.sliced_busy_fraction,
            slowdowns,
            predicted.switches * 3600 / horizon,
            predicted.sliced_busy_fraction * 3600,
            problems,
        )


def predict_group(
    profiles: Sequence[WorkloadProfile],
    hardware: Hardware,
    *,
    horizon_s: float,
    seed: int = 0,
    policy: str = "fifo",
    picker: Picker | None = None,
) -> InterleaveResult:
    """Simulate `profiles` sharing one group of `hardware` for `horizon_s` seconds,
    ordered by `policy` (or by `picker`, see `simulate_interleaving`)."""
    return simulate_interleaving(
        [p.to_job_profile() for p in profiles],
        gpu_bytes=hardware.gpu_bytes - hardware.headroom_bytes,
        bandwidth_bytes_per_s=hardware.bandwidth_bytes_per_s,
        overhead_s=hardware.overhead_s,
        policy=policy,
        horizon_s=horizon_s,
        seed=seed,
        picker=picker,
    )


def _with_policy(scorer: _Scorer, score: GroupScore, policies: Mapping[str, Picker]) -> GroupScore:
    """`score` with the policy `choose_policy` recommends for its jobs."""
    if len(score.jobs) < 2 or not score.allowed:
        return score
    profiles = [scorer.profiles[n] for n in score.jobs]
    horizon = scorer.horizon_s or max(
        MIN_HORIZON_S, CYCLES_PER_SCORE * max(p.cycle_seconds for p in profiles)
    )
    choice = choose_policy(
        score.jobs,
        {n: scorer.bound(n) for n in score.jobs},
        policies,
        lambda name, pick: predict_group(
            profiles, scorer.hardware, horizon_s=horizon, seed=scorer.seed, policy=name, picker=pick
        ),
    )
    return replace(score, policy=choice.policy, policy_reason=choice.reason)


Partition = tuple[frozenset[str], ...]


def _fleet(scores: Sequence[GroupScore]) -> float:
    return sum(s.busy_fraction for s in scores) / len(scores) if scores else 0.0


def _partitions(names: Sequence[str], size: int) -> Iterator[list[list[str]]]:
    """Every partition of `names` into blocks of at most `size` (the first name anchors a block)."""
    if not names:
        yield []
        return
    first, rest = names[0], names[1:]
    for k in range(min(size, len(names))):
        for others in combinations(rest, k):
            remaining = [n for n in rest if n not in others]
            for tail in _partitions(remaining, size):
                yield [[first, *others], *tail]


def _exhaustive(scorer: _Scorer, names: Sequence[str], size: int) -> Partition:
    blocks: dict[frozenset[str], GroupScore] = {}
    for k in range(1, size + 1):
        for combo in combinations(names, k):
            blocks[frozenset(combo)] = scorer.score(combo)
    best: Partition = tuple(frozenset([n]) for n in names)
    best_value = _fleet([blocks[b] for b in best])
    for partition in _partitions(list(names), size):
        keys = [frozenset(block) for block in partition]
        if all(blocks[k].allowed for k in keys):
            value = _fleet([blocks[k] for k in keys])
            if value > best_value + 1e-12:
                best, best_value = tuple(keys), value
    return best


def _heuristic(scorer: _Scorer, names: Sequence[str], size: int, budget: int) -> Partition:
    current = _merge(scorer, [frozenset([n]) for n in names], size, budget)
    # Polish within a budget of its own: a move or swap that raises the fleet busy
    # fraction, then merge again (the move may have made room).
    polish = min(budget, scorer.evaluations + max(100, 8 * len(names)))
    while (moved := _improve_once(scorer, current, size, polish)) is not None:
        current = moved
    return tuple(current)


def _merge(
    scorer: _Scorer, blocks: list[frozenset[str]], size: int, budget: int
) -> list[frozenset[str]]:
    """Greedy: join the two groups whose union loses the fewest GPU-seconds, while allowed."""
    current = list(blocks)
    while scorer.evaluations < budget:
        best: tuple[float, int, int] | None = None
        for i, j in combinations(range(len(current)), 2):
            union = current[i] | current[j]
            if len(union) > size:
                continue
            merged = scorer.score(tuple(union))
            if not merged.allowed:
                continue
            loss = (
                scorer.score(tuple(current[i])).busy_fraction
                + scorer.score(tuple(current[j])).busy_fraction
                - merged.busy_fraction
            )
            if best is None or loss < best[0] - 1e-12:
                best = (loss, i, j)
        if best is None:
            break
        _, i, j = best
        union = current[i] | current[j]
        current = [b for k, b in enumerate(current) if k not in (i, j)] + [union]
    return current


def _improve_once(
    scorer: _Scorer, blocks: list[frozenset[str]], size: int, budget: int
) -> list[frozenset[str]] | None:
    """The first move or swap of single jobs between two groups that, with the greedy merges
    it makes possible, raises the fleet busy fraction (every group allowed), or None."""

    def value(partition: Sequence[frozenset[str]]) -> float | None:
        scores = [scorer.score(tuple(b)) for b in partition]
        return _fleet(scores) if all(s.allowed for s in scores) else None

    current_value = value(blocks) or 0.0
    for i, j in combinations(range(len(blocks)), 2):
        a, b = blocks[i], blocks[j]
        moves: list[tuple[frozenset[str], frozenset[str]]] = []
        for x in sorted(a):
            if len(b) < size:
                moves.append((a - {x}, b | {x}))
            moves.extend(((a - {x}) | {y}, (b - {y}) | {x}) for y in sorted(b))
        moves.extend((a | {y}, b - {y}) for y in sorted(b) if len(a) < size)
        rest = [blk for k, blk in enumerate(blocks) if k not in (i, j)]
        for new_a, new_b in moves:
            if scorer.evaluations >= budget:
                return None
            trial = rest + [blk for blk in (new_a, new_b) if blk]
            if value(trial) is None:
                continue
            # Look one step ahead: the move may only pay once it lets two groups merge.
            merged = _merge(scorer, trial, size, budget)
            trial_value = value(merged)
            if trial_value is not None and trial_value > current_value + 1e-9:
                return merged
    return None


def advise(
    profiles: Sequence[WorkloadProfile],
    hardware: Hardware,
    *,
    max_slowdown: float = DEFAULT_MAX_SLOWDOWN,
    max_group_size: int = 4,
    max_groups: int | None = None,
    exhaustive_jobs: int = 8,
    max_evaluations: int = 4000,
    horizon_s: float | None = None,
    seed: int = 0,
    policies: Mapping[str, Picker] | None = None,
) -> Advice:
    """Place `profiles` into groups of `hardware`, maximising the fleet GPU busy fraction.

    `max_groups` (the groups a `--groups` file offers) is reported as a problem when the
    best placement needs more; `horizon_s` fixes the simulated horizon of every score
    (default: `CYCLES_PER_SCORE` cycles of the group's slowest job); `policies` (which
    must include `fifo`) adds a recommended policy to each chosen group.
    """
    if not profiles:
        raise InvalidArgumentError("profiles must not be empty")
    names = [p.name for p in profiles]
    if len(set(names)) != len(names):
        raise InvalidArgumentError("profiles must have distinct names")
    _checks.real("max_slowdown", max_slowdown, minimum=1.0)
    size = _checks.integer("max_group_size", max_group_size, minimum=1)
    _checks.integer("exhaustive_jobs", exhaustive_jobs, minimum=0)
    budget = _checks.integer("max_evaluations", max_evaluations, minimum=0)
    scorer = _Scorer({p.name: p for p in profiles}, hardware, max_slowdown, seed, horizon_s)
    problems = [msg for n in names for msg in scorer.memory_problems([n])]
    placeable = [n for n in names if not scorer.memory_problems([n])]
    if len(placeable) <= exhaustive_jobs:
        method: Literal["exhaustive", "heuristic"] = "exhaustive"
        partition = _exhaustive(scorer, placeable, size)
    else:
        method = "heuristic"
        partition = _heuristic(scorer, placeable, size, budget)
    chosen = sorted(
        (scorer.score(tuple(b)) for b in partition), key=lambda s: (-s.busy_fraction, s.jobs)
    )
    if policies is not None:
        chosen = [_with_policy(scorer, score, policies) for score in chosen]
    if max_groups is not None and len(chosen) > max_groups:
        problems.append(
            f"the placement needs {len(chosen)} groups; only {max_groups} are available"
        )
    candidates = sorted(
        (s for s in scorer.cache.values() if len(s.jobs) > 1),
        key=lambda s: (not s.allowed, not s.simulated, -s.busy_fraction, s.jobs),
    )
    alone = [p.gpu_fraction for p in profiles if p.name in placeable]
    return Advice(
        groups=tuple(chosen),
        busy_fraction=_fleet(chosen),
        dedicated_busy_fraction=sum(alone) / len(alone) if alone else 0.0,
        candidates=tuple(candidates),
        method=method,
        evaluations=scorer.evaluations,
        pruned=scorer.pruned,
        problems=tuple(problems),
    )


def gap_to_exhaustive(
    profiles: Sequence[WorkloadProfile], hardware: Hardware, **options: float | int | None
) -> tuple[float, float]:
    """(heuristic, exhaustive) fleet busy fractions for the same jobs (small cases only)."""
    heuristic = advise(profiles, hardware, exhaustive_jobs=0, **options)  # type: ignore[arg-type]
    exact = advise(profiles, hardware, exhaustive_jobs=len(profiles), **options)  # type: ignore[arg-type]
    return heuristic.busy_fraction, exact.busy_fraction


__all__ = [
    "DEFAULT_MAX_SLOWDOWN",
    "Advice",
    "GroupScore",
    "Hardware",
    "advise",
    "gap_to_exhaustive",
    "predict_group",
]
