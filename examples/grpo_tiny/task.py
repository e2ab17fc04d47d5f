"""The toy verifiable task: multi-digit addition, and its verifier (CPU only, no torch).

A prompt is `a+b=` with both operands written with `digits` digits (zero-padded). The
answer is `a + b` written with `digits + 1` digits, least significant digit first (the
order carries flow in, which a tiny model learns far faster), then EOS:

    prompt   0 7 + 3 5 =        (07 + 35)
    answer   2 4 0 <eos>        (42, reversed: 2, 4, 0)

The verifier compares the response with the true answer. Its reward has two components,
both in [0, 1]: `exact` (the whole answer and EOS, exactly) and `digits` (the fraction of
answer positions right). The policy trains on their sum; `exact` is the accuracy reported.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: Bumped whenever `verify` changes: every rollout record names the verifier that scored it.
VERIFIER_VERSION = "addition-v1"

PLUS = 10
EQUALS = 11
EOS = 12
VOCAB_SIZE = 13
_SYMBOLS = "0123456789+=$"


@dataclass(frozen=True)
class Problem:
    """One addition prompt: `a + b` with `digits`-digit operands."""

    a: int
    b: int
    digits: int

    @classmethod
    def from_prompt(cls, prompt_tokens: Sequence[int]) -> Problem:
        """The problem a prompt states (the verifier needs nothing but the record)."""
        digits = (len(prompt_tokens) - 2) // 2
        shaped = digits >= 1 and len(prompt_tokens) == prompt_length(digits)
        if not shaped or prompt_tokens[digits] != PLUS or prompt_tokens[-1] != EQUALS:
            raise ValueError(f"not an addition prompt: {render(prompt_tokens)!r}")
        a = int("".join(map(str, prompt_tokens[:digits])))
        b = int("".join(map(str, prompt_tokens[digits + 1 : -1])))
        return cls(a, b, digits)

    @property
    def prompt_tokens(self) -> list[int]:
        """`a`, `+`, `b`, `=` as token ids (operands most significant digit first)."""
        return [*_digits(self.a, self.digits), PLUS, *_digits(self.b, self.digits), EQUALS]

    @property
    def answer_tokens(self) -> list[int]:
        """The correct response: the sum's `digits + 1` digits, least significant first, EOS."""
        return [*reversed(_digits(self.a + self.b, self.digits + 1)), EOS]


def _digits(value: int, width: int) -> list[int]:
    return [int(c) for c in str(value).zfill(width)]


def prompt_length(digits: int) -> int:
    """Tokens in every prompt of the task."""
    return 2 * digits + 2


def response_length(digits: int) -> int:
    """Tokens in a full response: the answer's digits and EOS (the decoding budget)."""
    return digits + 2


def render(tokens: Sequence[int]) -> str:
    """Token ids as text, EOS as `$` (for logs)."""
    return "".join(_SYMBOLS[t] for t in tokens)


def truncate_at_eos(tokens: Sequence[int]) -> tuple[list[int], str]:
    """The response up to and including the first EOS, and its stop reason.

    `"eos"` when the policy ended it; `"length"` when it ran out of the decoding budget.
    """
    tokens = list(tokens)
    if EOS in tokens:
        return tokens[: tokens.index(EOS) + 1], "eos"
    return tokens, "length"


def verify(problem: Problem, response_tokens: Sequence[int]) -> dict[str, float]:
    """Score one response against the true answer: `{"exact": 0|1, "digits": fraction}`."""
    answer = problem.answer_tokens
    body = answer[:-1]
    right = sum(1 for got, want in zip(response_tokens, body, strict=False) if got == want)
    well_formed = len(response_tokens) == len(answer) and response_tokens[-1] == EOS
    return {
        "exact": 1.0 if list(response_tokens) == answer else 0.0,
        "digits": right / len(body),
        "format": 1.0 if well_formed and all(t < PLUS for t in response_tokens[:-1]) else 0.0,
    }


def total_reward(reward: Mapping[str, float]) -> float:
    """The scalar the policy is trained on: the sum of the reward's components."""
    return float(sum(reward.values()))
