"""The policy: a tiny causal transformer over the task's tokens, its sampler and scorer.

Attention is written out (matmul, mask, softmax) rather than a fused kernel, so that
`torch.use_deterministic_algorithms(True)` holds on CPU and on CUDA alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class PolicyConfig:
    """Sizes of the policy."""

    vocab_size: int
    max_length: int
    width: int = 64
    heads: int = 4
    layers: int = 2


class _Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=-1)
        shape = (batch, length, self.heads, width // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(width // self.heads)
        causal = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(1)
        attention = scores.masked_fill(causal, float("-inf")).softmax(dim=-1)
        mixed = (attention @ v).transpose(1, 2).reshape(batch, length, width)
        x = x + self.out(mixed)
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out


class TinyPolicy(nn.Module):
    """Token and position embeddings, a few pre-norm transformer blocks, a linear head."""

    def __init__(self, config: PolicyConfig) -> None:
        super().__init__()
        self.config = config
        self.tokens = nn.Embedding(config.vocab_size, config.width)
        self.positions = nn.Embedding(config.max_length, config.width)
        self.blocks = nn.ModuleList(
            _Block(config.width, config.heads) for _ in range(config.layers)
        )
        self.norm = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Next-token logits at every position: `[batch, length]` -> `[batch, length, vocab]`."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tokens(tokens) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.norm(x))
        return logits


@torch.no_grad()
def sample(
    policy: TinyPolicy,
    prompts: torch.Tensor,
    new_tokens: int,
    generator: torch.Generator,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample `new_tokens` tokens after each prompt; returns (tokens, behaviour log-probs).

    Always samples the whole budget (tokens after EOS are cut by the caller), so the
    generator advances by the same amount whatever the policy writes: the random stream a
    run consumes depends on the seed only. The log-probabilities are those of the
    distribution actually sampled from (after temperature), as the rollout contract asks.
    """
    sequence = prompts
    chosen: list[torch.Tensor] = []
    logprobs: list[torch.Tensor] = []
    for _ in range(new_tokens):
        logits = policy(sequence)[:, -1, :] / temperature
        log_dist = torch.log_softmax(logits, dim=-1)
        token = torch.multinomial(log_dist.exp(), 1, generator=generator)
        chosen.append(token)
        logprobs.append(log_dist.gather(1, token))
        sequence = torch.cat([sequence, token], dim=1)
    return torch.cat(chosen, dim=1), torch.cat(logprobs, dim=1)


def response_logprobs(
    policy: TinyPolicy, prompts: torch.Tensor, responses: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities the policy gives each response token now, and the entropy of its
    distribution at each of those positions (both `[batch, response_length]`, with grads)."""
    sequence = torch.cat([prompts, responses[:, :-1]], dim=1)
    logits = policy(sequence)[:, prompts.shape[1] - 1 :, :] / temperature
    log_dist = torch.log_softmax(logits, dim=-1)
    entropy = -(log_dist.exp() * log_dist).sum(dim=-1)
    return log_dist.gather(2, responses.unsqueeze(-1)).squeeze(-1), entropy
