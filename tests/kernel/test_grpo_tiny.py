"""The pure pieces of examples/grpo_tiny, and its learner on CPU.

Cases:
- task: prompt and answer tokens of a known problem; `from_prompt` inverts `prompt_tokens`
  (hypothesis) and refuses what is not an addition prompt; the verifier's components for
  the exact answer, a half-right one, a malformed one; EOS truncation and stop reasons.
- advantages: table (all equal -> 0; two-valued group -> -1/+1; groups independent); for any
  rewards each group's advantages sum to 0 and, unless constant, have unit spread
  (hypothesis); rewards that do not split into groups are refused.
- staleness: table of (versions, trainer version, bound) -> lag or StalenessError; a record
  newer than the trainer is refused.
- records: a scored sample meets the rollout contract; broken records raise ContractError
  naming the sample and the field.
- clipped loss: at ratio 1 it is minus the mean advantage over unmasked tokens; padding is
  ignored; a ratio past the clip range gives no gradient in the direction it already went.
- learner: two learners of one seed produce bit-identical rollouts, losses and weights,
  another seed differs; records from a real rollout meet the contract; sync mode refuses a
  stale batch; async mode's sampler lags one version until synced; 60 steps raise the
  reward (the policy learns).

torch is required: with RLSLICE_REQUIRE_TORCH=1 (CI) a missing torch fails instead of skipping.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

if os.environ.get("RLSLICE_REQUIRE_TORCH") == "1":
    import torch
else:
    torch = pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "grpo_tiny"
if str(EXAMPLE) not in sys.path:
    sys.path.insert(0, str(EXAMPLE))  # the example is not a package: its modules import by name

import grpo  # noqa: E402
import task  # noqa: E402
import train  # noqa: E402
from learner import Learner, Settings  # noqa: E402

from rlslice.planner import rollout_contract_errors  # noqa: E402

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)


# --- task ---------------------------------------------------------------------------------


def test_a_problem_states_its_operands_and_answers_least_significant_digit_first() -> None:
    problem = task.Problem(7, 35, digits=2)
    assert task.render(problem.prompt_tokens) == "07+35="
    assert task.render(problem.answer_tokens) == "240$"  # 42 as 2, 4, 0, then EOS
    assert len(problem.prompt_tokens) == task.prompt_length(2)
    assert len(problem.answer_tokens) == task.response_length(2)


@given(digits=st.integers(1, 4), data=st.data())
def test_from_prompt_recovers_every_problem(digits: int, data: st.DataObject) -> None:
    a = data.draw(st.integers(0, 10**digits - 1))
    b = data.draw(st.integers(0, 10**digits - 1))
    problem = task.Problem(a, b, digits)
    assert task.Problem.from_prompt(problem.prompt_tokens) == problem
    assert task.verify(problem, problem.answer_tokens) == {
        "exact": 1.0,
        "digits": 1.0,
        "format": 1.0,
    }


@pytest.mark.parametrize(
    "tokens", [[1, task.PLUS, 2], [1, 2, 3, task.EQUALS], [1, task.PLUS, 2, 3], []]
)
def test_from_prompt_refuses_what_is_not_an_addition_prompt(tokens: list[int]) -> None:
    with pytest.raises(ValueError, match="not an addition prompt"):
        task.Problem.from_prompt(tokens)


@pytest.mark.parametrize(
    ("response", "reward"),
    [
        ("240$", {"exact": 1.0, "digits": 1.0, "format": 1.0}),
        ("200$", {"exact": 0.0, "digits": 2 / 3, "format": 1.0}),
        ("24$", {"exact": 0.0, "digits": 2 / 3, "format": 0.0}),
        ("2400", {"exact": 0.0, "digits": 1.0, "format": 0.0}),
        ("$", {"exact": 0.0, "digits": 0.0, "format": 0.0}),
        ("2+0$", {"exact": 0.0, "digits": 2 / 3, "format": 0.0}),
    ],
)
def test_the_verifier_scores_exactness_digits_and_format(
    response: str, reward: dict[str, float]
) -> None:
    tokens = ["0123456789+=$".index(c) for c in response]
    assert task.verify(task.Problem(7, 35, 2), tokens) == pytest.approx(reward)


@pytest.mark.parametrize(
    ("tokens", "kept", "reason"),
    [
        ([1, 2, task.EOS, 4], [1, 2, task.EOS], "eos"),
        ([task.EOS, task.EOS], [task.EOS], "eos"),
        ([1, 2, 3], [1, 2, 3], "length"),
    ],
)
def test_a_response_ends_at_its_first_eos(tokens: list[int], kept: list[int], reason: str) -> None:
    assert task.truncate_at_eos(tokens) == (kept, reason)


# --- advantages ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rewards", "size", "expected"),
    [
        ([1.0, 1.0, 1.0, 1.0], 4, [0.0, 0.0, 0.0, 0.0]),
        ([0.0, 1.0], 2, [-1.0, 1.0]),
        ([0.0, 2.0, 5.0, 5.0], 2, [-1.0, 1.0, 0.0, 0.0]),
        ([3.0, 1.0, 1.0, 3.0], 4, [1.0, -1.0, -1.0, 1.0]),
    ],
)
def test_advantages_are_relative_to_each_group(
    rewards: list[float], size: int, expected: list[float]
) -> None:
    assert grpo.group_advantages(rewards, size) == pytest.approx(expected, abs=1e-5)


@given(
    size=st.integers(2, 8),
    groups=st.integers(1, 4),
    data=st.data(),
)
def test_each_groups_advantages_sum_to_zero_with_unit_spread(
    size: int, groups: int, data: st.DataObject
) -> None:
    rewards = data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 3.0]), min_size=size * groups,
                                 max_size=size * groups))  # fmt: skip
    advantages = grpo.group_advantages(rewards, size)
    for start in range(0, len(rewards), size):
        group = advantages[start : start + size]
        assert sum(group) == pytest.approx(0.0, abs=1e-6)
        spread = math.sqrt(sum(a * a for a in group) / size)
        constant = len(set(rewards[start : start + size])) == 1
        assert spread == pytest.approx(0.0 if constant else 1.0, abs=1e-4)


@pytest.mark.parametrize(("count", "size"), [(5, 2), (4, 0), (3, -1)])
def test_rewards_that_do_not_split_into_groups_are_refused(count: int, size: int) -> None:
    with pytest.raises(ValueError, match="groups of"):
        grpo.group_advantages([0.0] * count, size)


# --- staleness ----------------------------------------------------------------------------


def _versions(*versions: int) -> list[dict[str, Any]]:
    return [{"policy_version": v} for v in versions]


@pytest.mark.parametrize(
    ("versions", "trainer", "bound", "lag"),
    [((3, 3), 3, 0, 0), ((2, 3), 3, 1, 1), ((5,), 7, 2, 2), ((0,), 0, 0, 0)],
)
def test_a_batch_within_the_bound_reports_its_lag(
    versions: tuple[int, ...], trainer: int, bound: int, lag: int
) -> None:
    assert grpo.check_staleness(_versions(*versions), trainer, bound) == lag


@pytest.mark.parametrize(
    ("versions", "trainer", "bound", "fragment"),
    [
        ((2, 3), 3, 0, "lags the trainer's 3 by 1 versions; max_staleness is 0"),
        ((1,), 4, 2, "by 3 versions"),
        ((5,), 4, 9, "newer than the trainer's 4"),
    ],
)
def test_a_batch_past_the_bound_or_from_the_future_is_refused(
    versions: tuple[int, ...], trainer: int, bound: int, fragment: str
) -> None:
    with pytest.raises(grpo.StalenessError, match=fragment.replace("'", ".")):
        grpo.check_staleness(_versions(*versions), trainer, bound)


# --- records ------------------------------------------------------------------------------


def _sample(**changes: Any) -> grpo.Sample:
    fields: dict[str, Any] = {
        "sample_id": "grpo-a-0000-000-00",
        "prompt_id": "grpo-a-0000-000",
        "policy_version": 0,
        "prompt_tokens": [0, 7, task.PLUS, 3, 5, task.EQUALS],
        "response_tokens": [2, 4, 0, task.EOS],
        "behavior_logprobs": [-0.1, -0.2, -0.3, -0.4],
        "decoding": {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 4},
        "stop_reason": "eos",
    }
    return grpo.Sample(**(fields | changes))


def test_a_scored_sample_meets_the_rollout_contract() -> None:
    record = _sample().scored({"exact": 1.0, "digits": 1.0}, task.VERIFIER_VERSION)
    assert rollout_contract_errors(record) == []
    grpo.check_records([record])  # does not raise
    assert record["verifier_version"] == task.VERIFIER_VERSION


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"behavior_logprobs": [-0.1, -0.2]}, "must align with response_tokens"),
        ({"behavior_logprobs": [-0.1, 0.5, -0.3, -0.4]}, r"behavior_logprobs\[1\]"),
        ({"response_tokens": [], "behavior_logprobs": []}, "response_tokens must not be empty"),
        ({"policy_version": -1}, "policy_version"),
        ({"stop_reason": ""}, "stop_reason must not be empty"),
    ],
)
def test_a_broken_record_raises_naming_the_sample_and_field(
    changes: dict[str, Any], fragment: str
) -> None:
    record = _sample(**changes).scored({"exact": 0.0}, task.VERIFIER_VERSION)
    with pytest.raises(grpo.ContractError, match="grpo-a-0000-000-00") as caught:
        grpo.check_records([_sample().scored({"exact": 1.0}, "v"), record])
    assert caught.match(fragment)


def test_a_record_missing_its_verifier_version_is_refused() -> None:
    record = _sample().scored({"exact": 1.0}, task.VERIFIER_VERSION)
    del record["verifier_version"]
    with pytest.raises(grpo.ContractError, match="missing fields: verifier_version"):
        grpo.check_records([record])


# --- clipped loss -------------------------------------------------------------------------


def _batch(behavior: list[list[float]], mask: list[list[float]], adv: list[float]) -> grpo.Batch:
    n, length = len(behavior), len(behavior[0])
    return grpo.Batch(
        prompts=torch.zeros(n, 1, dtype=torch.long),
        responses=torch.zeros(n, length, dtype=torch.long),
        mask=torch.tensor(mask),
        behavior_logprobs=torch.tensor(behavior),
        advantages=torch.tensor(adv),
    )


def test_at_ratio_one_the_loss_is_minus_the_mean_advantage_over_real_tokens() -> None:
    behavior = [[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]]
    batch = _batch(behavior, [[1, 1, 0], [1, 0, 0]], [2.0, -1.0])
    loss, clipped = grpo.clipped_policy_loss(torch.tensor(behavior), batch, clip=0.2)
    # Three real tokens: two with advantage 2, one with -1; padding does not count.
    assert loss.item() == pytest.approx(-(2.0 + 2.0 - 1.0) / 3)
    assert clipped == 0.0


def test_a_ratio_past_the_clip_range_stops_pushing_further() -> None:
    batch = _batch([[-1.0, -1.0]], [[1, 1]], [1.0])
    # Token 0: ratio e^0.5 > 1.2 with a positive advantage: clipped, no gradient.
    # Token 1: ratio 1: inside the range, gradient -advantage / tokens.
    logprobs = torch.tensor([[-0.5, -1.0]], requires_grad=True)
    loss, clipped = grpo.clipped_policy_loss(logprobs, batch, clip=0.2)
    loss.backward()
    assert logprobs.grad is not None
    assert logprobs.grad[0].tolist() == pytest.approx([0.0, -0.5])
    assert clipped == 0.5


# --- learner ------------------------------------------------------------------------------

SMALL = Settings(seed=3, digits=1, prompts=4, group_size=4)


def _step(learner: Learner, step: int) -> tuple[list[dict[str, Any]], float]:
    records = train.verified(learner.rollout(step))
    return records, learner.train(records, max_staleness=0).loss


def test_one_seed_gives_bit_identical_runs_and_another_seed_does_not() -> None:
    runs = [Learner(s, torch.device("cpu"), "grpo-a") for s in (SMALL, SMALL)]
    other = Learner(Settings(seed=4, digits=1, prompts=4, group_size=4), torch.device("cpu"), "x")
    for step in range(3):
        (records_a, loss_a), (records_b, loss_b) = (_step(r, step) for r in runs)
        assert records_a == records_b
        assert loss_a.hex() == loss_b.hex()
        _step(other, step)
    assert runs[0].weights_digest() == runs[1].weights_digest()
    assert other.weights_digest() != runs[0].weights_digest()
    assert runs[0].version == 3


def test_records_from_a_real_rollout_meet_the_contract() -> None:
    learner = Learner(SMALL, torch.device("cpu"), "grpo-a")
    records = train.verified(learner.rollout(0))
    assert len(records) == SMALL.prompts * SMALL.group_size
    assert all(rollout_contract_errors(r) == [] for r in records)
    assert len({r["sample_id"] for r in records}) == len(records)
    assert len({r["prompt_id"] for r in records}) == SMALL.prompts
    assert {r["policy_version"] for r in records} == {0}


def test_sync_mode_refuses_a_batch_sampled_before_the_last_step() -> None:
    learner = Learner(SMALL, torch.device("cpu"), "grpo-a")
    stale = train.verified(learner.rollout(0))
    _step(learner, 1)
    with pytest.raises(grpo.StalenessError, match="max_staleness is 0"):
        learner.train(stale, max_staleness=0)
    assert learner.version == 1  # refused: nothing trained


def test_the_async_sampler_lags_one_version_until_synced() -> None:
    settings = Settings(seed=3, digits=1, prompts=4, group_size=4, separate_sampler=True)
    learner = Learner(settings, torch.device("cpu"), "grpo-a")
    records = train.verified(learner.rollout(0))
    learner.train(records, max_staleness=1)
    upcoming = train.verified(learner.rollout(1))
    assert {r["policy_version"] for r in upcoming} == {0}
    stats = learner.train(upcoming, max_staleness=1)
    assert stats.staleness == 1
    learner.sync_sampler()
    assert {r["policy_version"] for r in train.verified(learner.rollout(2))} == {2}


def test_the_policy_learns_within_sixty_steps() -> None:
    learner = Learner(Settings(seed=0), torch.device("cpu"), "grpo-a")
    rewards = [learner.train(train.verified(learner.rollout(s)), 0).reward for s in range(60)]
    first, last = sum(rewards[:12]) / 12, sum(rewards[-12:]) / 12
    assert last > first + 0.3, (first, last)


# --- compare.py's verdict -----------------------------------------------------------------


def _run(losses: list[float], digest: str, moved: int = 0) -> dict[str, Any]:
    steps = [
        {"loss": x.hex(), "reward": (1.0).hex(), "restored": int(moved > 0), "moved_bytes": moved}
        for x in losses
    ]
    return {"seed": 1, "seconds": 1.0, "steps": steps, "weights_sha256": digest}


def test_the_verdict_flags_one_differing_bit_and_counts_the_moves() -> None:
    import compare

    same = compare.judge("grpo-a", _run([0.5, 0.25], "d1"), _run([0.5, 0.25], "d1", moved=10))
    assert same.identical
    assert (same.restored_grants, same.moved_bytes) == (2, 20)
    nudged = math.nextafter(0.25, 1.0)
    differs = compare.judge("grpo-a", _run([0.5, 0.25], "d1"), _run([0.5, nudged], "d2"))
    assert not differs.losses_identical
    assert not differs.weights_identical
    assert differs.rewards_identical
    assert "DIFFERENT" in compare.table([same, differs], group_switches=3)
