"""The rollout record contract: precise messages for each way a record can break it.

Cases: the notebook's valid and broken records; a non-dict; each required field missing;
wrong types and values per field (strings, policy_version incl. bools and version strings,
token lists, log-probabilities incl. NaN, positive values and misalignment, decoding and
reward mappings); several errors at once are all reported.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from rlslice.planner import REQUIRED_FIELDS, rollout_contract_errors

GOOD: dict[str, Any] = {
    "sample_id": "run12-p003-r01",
    "prompt_id": "p003",
    "policy_version": 17,
    "prompt_tokens": [101, 42, 17],
    "response_tokens": [314, 159, 2],
    "behavior_logprobs": [-0.31, -1.07, -0.22],
    "decoding": {"temperature": 0.8, "top_p": 1.0},
    "reward": {"correctness": 1.0, "format": 0.0},
    "stop_reason": "eos",
    "verifier_version": "arith-v4",
}


def test_the_notebook_good_record_is_valid() -> None:
    assert rollout_contract_errors(GOOD) == []


def test_the_notebook_broken_record_reports_the_missing_logprobs_and_the_negative_version() -> None:
    broken = dict(GOOD)
    broken.pop("behavior_logprobs")
    broken["policy_version"] = -1
    assert rollout_contract_errors(broken) == [
        "missing fields: behavior_logprobs",
        "policy_version must be a non-negative integer, got -1",
    ]


def test_a_record_that_is_not_a_dict_is_refused_outright() -> None:
    assert rollout_contract_errors([("sample_id", "x")]) == ["record must be a dict, got list"]


def test_an_empty_record_lists_every_field_as_missing_in_order() -> None:
    assert rollout_contract_errors({}) == ["missing fields: " + ", ".join(sorted(REQUIRED_FIELDS))]


def test_a_scalar_reward_is_accepted() -> None:
    assert rollout_contract_errors({**GOOD, "reward": 1.0}) == []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"sample_id": 7}, "sample_id must be a string, got int"),
        ({"prompt_id": "  "}, "prompt_id must not be empty"),
        ({"stop_reason": None}, "stop_reason must be a string, got NoneType"),
        ({"verifier_version": ""}, "verifier_version must not be empty"),
        ({"policy_version": True}, "policy_version must be a non-negative integer, got bool True"),
        ({"policy_version": "17"}, "policy_version must be a non-negative integer, got str '17'"),
        ({"policy_version": 17.0}, "policy_version must be a non-negative integer, got float 17.0"),
        ({"prompt_tokens": (101, 42)}, "prompt_tokens must be a list of token ids, got tuple"),
        (
            {"prompt_tokens": [101, -1]},
            "prompt_tokens[1] must be a non-negative integer token id, got -1",
        ),
        (
            {"response_tokens": [314, True, 2]},
            "response_tokens[1] must be a non-negative integer token id, got True",
        ),
        ({"response_tokens": [], "behavior_logprobs": []}, "response_tokens must not be empty"),
        ({"behavior_logprobs": "-0.3"}, "behavior_logprobs must be a list of numbers, got str"),
        (
            {"behavior_logprobs": [-0.3, math.nan, -0.2]},
            "behavior_logprobs[1] must be a finite number <= 0, got nan",
        ),
        (
            {"behavior_logprobs": [-0.3, 0.1, -0.2]},
            "behavior_logprobs[1] must be a finite number <= 0, got 0.1",
        ),
        (
            {"behavior_logprobs": [-0.3, False, -0.2]},
            "behavior_logprobs[1] must be a finite number <= 0, got False",
        ),
        (
            {"behavior_logprobs": [-0.3, -0.2]},
            "behavior_logprobs has 2 entries but response_tokens has 3: "
            "log-probabilities must align with response_tokens",
        ),
        ({"decoding": [("temperature", 0.8)]}, "decoding must be a mapping, got list"),
        ({"decoding": {"temperature": -1}}, "decoding.temperature must be a number >= 0, got -1"),
        ({"decoding": {"top_p": 0}}, "decoding.top_p must lie in (0, 1], got 0"),
        ({"decoding": {"top_k": math.inf}}, "decoding.top_k must be finite, got inf"),
        ({"reward": "1.0"}, "reward must be a number or a mapping of component -> number, got str"),
        ({"reward": math.inf}, "reward must be finite, got inf"),
        ({"reward": {}}, "reward must not be an empty mapping"),
        ({"reward": {"correctness": None}}, "reward.correctness must be a finite number, got None"),
    ],
)
def test_each_violation_has_a_precise_message(change: dict[str, Any], message: str) -> None:
    assert rollout_contract_errors({**GOOD, **change}) == [message]


def test_several_violations_are_all_reported() -> None:
    errors = rollout_contract_errors(
        {**GOOD, "sample_id": "", "reward": None, "policy_version": -2}
    )
    assert len(errors) == 3
