"""The rollout record contract: what one training record must carry to be replayable.

A string and one number lose the tokenisation, the policy's token mask, the behaviour
log-probabilities, the weights version, the decoding parameters, the stop reason and the
reward's provenance; without them neither the loss nor a failure can be reconstructed.
The unit here is one continuation produced by one behaviour version: `prompt_tokens` is
the context before it, `response_tokens` the tokens the policy chose, and
`behavior_logprobs` are aligned with exactly those.

`rollout_contract_errors(record)` returns every violation as a one-line message naming the
field (and the element index); an empty list means the record is valid.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

#: Fields every rollout record carries.
REQUIRED_FIELDS: frozenset[str] = frozenset(
    {
        "sample_id",
        "prompt_id",
        "policy_version",
        "prompt_tokens",
        "response_tokens",
        "behavior_logprobs",
        "decoding",
        "reward",
        "stop_reason",
        "verifier_version",
    }
)

_STRING_FIELDS = ("sample_id", "prompt_id", "stop_reason", "verifier_version")


def _is_number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float)


def _check_string(record: Mapping[str, Any], key: str, errors: list[str]) -> None:
    value = record[key]
    if not isinstance(value, str):
        errors.append(f"{key} must be a string, got {type(value).__name__}")
    elif not value.strip():
        errors.append(f"{key} must not be empty")


def _check_version(value: object, errors: list[str]) -> None:
    # A version string is never coerced to a number: a numeric version needs a registry.
    if isinstance(value, bool) or not isinstance(value, int):
        errors.append(
            f"policy_version must be a non-negative integer, got {type(value).__name__} {value!r}"
        )
    elif value < 0:
        errors.append(f"policy_version must be a non-negative integer, got {value}")


def _check_tokens(key: str, value: object, errors: list[str]) -> None:
    if not isinstance(value, list):
        errors.append(f"{key} must be a list of token ids, got {type(value).__name__}")
        return
    if key == "response_tokens" and not value:
        errors.append("response_tokens must not be empty")
    for index, token in enumerate(value):
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            errors.append(f"{key}[{index}] must be a non-negative integer token id, got {token!r}")
            return  # one message per field keeps the report readable


def _check_logprobs(record: Mapping[str, Any], errors: list[str]) -> None:
    value = record["behavior_logprobs"]
    if not isinstance(value, list):
        errors.append(f"behavior_logprobs must be a list of numbers, got {type(value).__name__}")
        return
    for index, logp in enumerate(value):
        if not _is_number(logp) or not math.isfinite(logp) or logp > 0:
            errors.append(f"behavior_logprobs[{index}] must be a finite number <= 0, got {logp!r}")
            return
    tokens = record.get("response_tokens")
    if isinstance(tokens, list) and len(value) != len(tokens):
        errors.append(
            f"behavior_logprobs has {len(value)} entries but response_tokens has "
            f"{len(tokens)}: log-probabilities must align with response_tokens"
        )


def _check_decoding(value: object, errors: list[str]) -> None:
    if not isinstance(value, Mapping):
        errors.append(f"decoding must be a mapping, got {type(value).__name__}")
        return
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            errors.append(f"decoding keys must be non-empty strings, got {key!r}")
            return
        if _is_number(item) and not math.isfinite(item):
            errors.append(f"decoding.{key} must be finite, got {item!r}")
    temperature = value.get("temperature")
    if temperature is not None and (not _is_number(temperature) or temperature < 0):
        errors.append(f"decoding.temperature must be a number >= 0, got {temperature!r}")
    top_p = value.get("top_p")
    if top_p is not None and (not _is_number(top_p) or not 0 < top_p <= 1):
        errors.append(f"decoding.top_p must lie in (0, 1], got {top_p!r}")


def _check_reward(value: object, errors: list[str]) -> None:
    if _is_number(value):
        if not math.isfinite(value):  # type: ignore[arg-type]
            errors.append(f"reward must be finite, got {value!r}")
        return
    if not isinstance(value, Mapping):
        errors.append(
            f"reward must be a number or a mapping of component -> number, got "
            f"{type(value).__name__}"
        )
        return
    if not value:
        errors.append("reward must not be an empty mapping")
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            errors.append(f"reward keys must be non-empty strings, got {key!r}")
        elif not _is_number(item) or not math.isfinite(item):
            errors.append(f"reward.{key} must be a finite number, got {item!r}")


def rollout_contract_errors(record: object) -> list[str]:
    """Every way `record` breaks the rollout contract; `[]` when it is valid."""
    if not isinstance(record, dict):
        return [f"record must be a dict, got {type(record).__name__}"]
    errors: list[str] = []
    missing = sorted(REQUIRED_FIELDS - set(record))
    if missing:
        errors.append("missing fields: " + ", ".join(missing))
    present = REQUIRED_FIELDS & set(record)
    for key in _STRING_FIELDS:
        if key in present:
            _check_string(record, key, errors)
    if "policy_version" in present:
        _check_version(record["policy_version"], errors)
    for key in ("prompt_tokens", "response_tokens"):
        if key in present:
            _check_tokens(key, record[key], errors)
    if "behavior_logprobs" in present:
        _check_logprobs(record, errors)
    if "decoding" in present:
        _check_decoding(record["decoding"], errors)
    if "reward" in present:
        _check_reward(record["reward"], errors)
    return errors
