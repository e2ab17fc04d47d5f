"""GRPO's pieces: rollout records, the contract and staleness checks, group-relative
advantages, and the clipped policy-gradient loss.

Everything here except `collate` and `clipped_policy_loss` is plain Python over plain data,
so it is tested without a model.

A rollout record is the course module's contract (`rlslice.planner.rollout_contract_errors`):
one continuation produced by one behaviour version. `prompt_tokens` is the context before
it, `response_tokens` the tokens the policy chose (up to and including EOS), and
`behavior_logprobs` the log-probabilities of exactly those tokens under the distribution
they were sampled from. `policy_version` is the weight version that sampled them, and
`verifier_version` the verifier that scored them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlslice.planner import rollout_contract_errors


class ContractError(ValueError):
    """A rollout record breaks the contract: training on it could not be reconstructed."""


class StalenessError(ValueError):
    """A record was sampled by a policy older than the trainer accepts."""


@dataclass(frozen=True)
class Sample:
    """One continuation before the verifier has scored it (what the rollout phase returns)."""

    sample_id: str
    prompt_id: str
    policy_version: int
    prompt_tokens: list[int]
    response_tokens: list[int]
    behavior_logprobs: list[float]
    decoding: Mapping[str, float | int]
    stop_reason: str

    def scored(self, reward: Mapping[str, float], verifier_version: str) -> dict[str, Any]:
        """The rollout record: this sample plus its reward and the verifier that gave it."""
        return {
            "sample_id": self.sample_id,
            "prompt_id": self.prompt_id,
            "policy_version": self.policy_version,
            "prompt_tokens": list(self.prompt_tokens),
            "response_tokens": list(self.response_tokens),
            "behavior_logprobs": list(self.behavior_logprobs),
            "decoding": dict(self.decoding),
            "reward": dict(reward),
            "stop_reason": self.stop_reason,
            "verifier_version": verifier_version,
        }


def check_records(records: Sequence[Mapping[str, Any]]) -> None:
    """Raise `ContractError` naming the first broken record and every way it breaks."""
    for index, record in enumerate(records):
        errors = rollout_contract_errors(dict(record))
        if errors:
            name = record.get("sample_id", f"#{index}")
            raise ContractError(f"rollout record {name}: " + "; ".join(errors))


def staleness(records: Sequence[Mapping[str, Any]], trainer_version: int) -> int:
    """How many versions the oldest record lags the trainer (0: all on-policy)."""
    return max(trainer_version - int(r["policy_version"]) for r in records)


def check_staleness(
    records: Sequence[Mapping[str, Any]], trainer_version: int, max_staleness: int
) -> int:
    """The batch's staleness; `StalenessError` past `max_staleness` or from a future version."""
    newest = max(int(r["policy_version"]) for r in records)
    if newest > trainer_version:
        raise StalenessError(
            f"policy_version {newest} is newer than the trainer's {trainer_version}"
        )
    lag = staleness(records, trainer_version)
    if lag > max_staleness:
        raise StalenessError(
            f"policy_version lags the trainer's {trainer_version} by {lag} versions; "
            f"max_staleness is {max_staleness}"
        )
    return lag


def group_advantages(rewards: Sequence[float], group_size: int, eps: float = 1e-6) -> list[float]:
    """GRPO's advantages: each reward minus its group's mean, over the group's std + eps.

    `rewards` holds consecutive groups of `group_size` samples of the same prompt. A group
    whose samples all scored the same teaches nothing: its advantages are 0.
    """
    if group_size <= 0 or len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} rewards do not split into groups of {group_size}")
    advantages: list[float] = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start : start + group_size]
        mean = sum(group) / group_size
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / group_size)
        advantages.extend((r - mean) / (std + eps) for r in group)
    return advantages


@dataclass(frozen=True)
class Batch:
    """Records as padded tensors for the trainer."""

    prompts: torch.Tensor  # [n, prompt_length]
    responses: torch.Tensor  # [n, response_length], padded with EOS
    mask: torch.Tensor  # [n, response_length], 1.0 on tokens the policy chose
    behavior_logprobs: torch.Tensor  # [n, response_length], 0.0 on padding
    advantages: torch.Tensor  # [n]


def collate(
    records: Sequence[Mapping[str, Any]],
    advantages: Sequence[float],
    response_length: int,
    pad: int,
    device: torch.device,
) -> Batch:
    """Pad every response to `response_length` and stack the records."""
    n = len(records)
    responses = torch.full((n, response_length), pad, dtype=torch.long)
    mask = torch.zeros(n, response_length)
    behavior = torch.zeros(n, response_length)
    for row, record in enumerate(records):
        length = len(record["response_tokens"])
        responses[row, :length] = torch.tensor(record["response_tokens"])
        mask[row, :length] = 1.0
        behavior[row, :length] = torch.tensor(record["behavior_logprobs"])
    return Batch(
        prompts=torch.tensor([r["prompt_tokens"] for r in records], device=device),
        responses=responses.to(device),
        mask=mask.to(device),
        behavior_logprobs=behavior.to(device),
        advantages=torch.tensor(advantages, dtype=torch.float32, device=device),
    )


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` over the positions where `mask` is 1."""
    return (values * mask).sum() / mask.sum()


def clipped_policy_loss(
    logprobs: torch.Tensor, batch: Batch, clip: float
) -> tuple[torch.Tensor, float]:
    """PPO's clipped surrogate with GRPO's advantages, averaged over response tokens.

    The ratio is taken against the behaviour log-probabilities of the records, not against
    a recomputation: with stale samples (async mode) that is the policy that really chose
    the tokens. Returns the loss and the fraction of tokens whose ratio was clipped.
    """
    ratio = torch.exp(logprobs - batch.behavior_logprobs)
    advantage = batch.advantages.unsqueeze(1)
    unclipped = ratio * advantage
    clipped = ratio.clamp(1.0 - clip, 1.0 + clip) * advantage
    per_token = -torch.minimum(unclipped, clipped)
    clipped_fraction = masked_mean(((ratio - 1.0).abs() > clip).float(), batch.mask)
    return masked_mean(per_token, batch.mask), float(clipped_fraction)
