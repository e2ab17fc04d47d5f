"""The job's GPU state and GPU work: the policy being trained, the sampler's copy of it
(async mode), the optimizer, the weight version, and the rollout and train steps.

Nothing here knows about rlslice: `train.py` decides when these run and which phase
holds the GPU meanwhile.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpo
import task
import torch
from policy import PolicyConfig, TinyPolicy, response_logprobs, sample


@dataclass(frozen=True)
class Settings:
    """What one job trains and how."""

    seed: int = 0
    digits: int = 1
    prompts: int = 8
    """Prompts per step."""
    group_size: int = 16
    """Samples per prompt (GRPO's group)."""
    temperature: float = 1.0
    lr: float = 1e-3
    clip: float = 0.2
    """PPO clip range of the ratio to the behaviour policy."""
    entropy_coef: float = 0.05
    """Weight of the entropy bonus."""
    separate_sampler: bool = False
    """Sample from a copy of the weights, synced by `sync_sampler()` (async mode)."""


@dataclass(frozen=True)
class TrainStats:
    """What one optimizer step did."""

    version: int
    """The weight version after the step."""
    loss: float
    reward: float
    """Mean total reward of the batch trained on."""
    exact: float
    """Fraction of exactly right answers in the batch."""
    staleness: int
    clipped: float


class Learner:
    """Policy, optimizer and weight version on `device`, with the generators of one seed."""

    def __init__(self, settings: Settings, device: torch.device, job: str) -> None:
        self.settings = settings
        self.device = device
        self.job = job
        torch.manual_seed(settings.seed)  # the initial weights
        config = PolicyConfig(
            vocab_size=task.VOCAB_SIZE,
            max_length=task.prompt_length(settings.digits) + task.response_length(settings.digits),
        )
        self.policy = TinyPolicy(config).to(device)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=settings.lr)
        self.version = 0
        # The sampler's weights and their version: the policy itself in sync mode; a copy,
        # refreshed only by sync_sampler(), in async mode.
        self.sampler = copy.deepcopy(self.policy) if settings.separate_sampler else self.policy
        self._synced_version = 0
        # Prompts and samples come from their own seeded streams, used by rollout() only:
        # what a run draws depends on the seed and the step, never on timing.
        self.data = torch.Generator().manual_seed(settings.seed + 1)
        self.sampling = torch.Generator(device=device).manual_seed(settings.seed + 2)

    @property
    def sampler_version(self) -> int:
        """The weight version the sampler samples with."""
        return self.version if self.sampler is self.policy else self._synced_version

    @property
    def device_bytes(self) -> int:
        """Bytes of device state: weights, gradients, Adam's two moments, the sampler copy."""
        weights = sum(p.numel() * p.element_size() for p in self.policy.parameters())
        return weights * (5 if self.settings.separate_sampler else 4)

    def rollout(self, step: int) -> list[grpo.Sample]:
        """Sample `group_size` answers to each of `prompts` new problems with the sampler."""
        s = self.settings
        operands = torch.randint(0, 10**s.digits, (s.prompts, 2), generator=self.data)
        problems = [task.Problem(int(a), int(b), s.digits) for a, b in operands.tolist()]
        prompts = torch.tensor(
            [p.prompt_tokens for p in problems for _ in range(s.group_size)], device=self.device
        )
        budget = task.response_length(s.digits)
        tokens, logprobs = sample(self.sampler, prompts, budget, self.sampling, s.temperature)
        decoding = {"temperature": s.temperature, "top_p": 1.0, "max_new_tokens": budget}
        samples = []
        for row, (chosen, logps) in enumerate(zip(tokens.tolist(), logprobs.tolist(), strict=True)):
            response, stop_reason = task.truncate_at_eos(chosen)
            prompt_id = f"{self.job}-{step:04d}-{row // s.group_size:03d}"
            samples.append(
                grpo.Sample(
                    sample_id=f"{prompt_id}-{row % s.group_size:02d}",
                    prompt_id=prompt_id,
                    policy_version=self.sampler_version,
                    prompt_tokens=prompts[row].tolist(),
                    response_tokens=response,
                    behavior_logprobs=logps[: len(response)],
                    decoding=decoding,
                    stop_reason=stop_reason,
                )
            )
        return samples

    def train(self, records: Sequence[Mapping[str, Any]], max_staleness: int) -> TrainStats:
        """One clipped policy-gradient step on verified records: version -> version + 1."""
        lag = grpo.check_staleness(records, self.version, max_staleness)
        rewards = [task.total_reward(r["reward"]) for r in records]
        advantages = grpo.group_advantages(rewards, self.settings.group_size)
        batch = grpo.collate(
            records, advantages, task.response_length(self.settings.digits), task.EOS, self.device
        )
        logprobs, entropy = response_logprobs(
            self.policy, batch.prompts, batch.responses, self.settings.temperature
        )
        loss, clipped = grpo.clipped_policy_loss(logprobs, batch, self.settings.clip)
        # An entropy bonus keeps the policy exploring: without it the tiny model settles on
        # one answer per prompt early and every group then scores alike (no signal left).
        loss = loss - self.settings.entropy_coef * grpo.masked_mean(entropy, batch.mask)
        self.optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        self.optimizer.step()
        self.version += 1
        return TrainStats(
            version=self.version,
            loss=float(loss.item()),
            reward=sum(rewards) / len(rewards),
            exact=sum(r["reward"]["exact"] for r in records) / len(records),
            staleness=lag,
            clipped=clipped,
        )

    def sync_sampler(self) -> None:
        """Copy the trainer's weights into the sampler (the weight sync of async RL)."""
        if self.sampler is not self.policy:
            self.sampler.load_state_dict(self.policy.state_dict())
        self._synced_version = self.version

    def weights_digest(self) -> str:
        """SHA-256 of the policy's weights, for bit-identity checks across runs."""
        digest = hashlib.sha256()
        for name, tensor in sorted(self.policy.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().to("cpu").contiguous().view(torch.uint8).numpy())
        return digest.hexdigest()
