"""Capped exponential backoff with jitter, for reconnecting to a restarting scheduler. Pure."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """Delays between attempts: `initial * factor**n`, capped, each scaled by jitter.

    Jitter spreads the reconnects of many jobs after a scheduler restart so they do not
    all arrive in the same instant.
    """

    initial: float = 0.05
    """Seconds before the first retry."""
    cap: float = 2.0
    """Longest delay between two attempts, in seconds."""
    factor: float = 2.0
    """Growth per attempt."""
    jitter: float = 0.2
    """Each delay is scaled by a factor drawn from [1 - jitter, 1]."""

    def delays(self, rand: Callable[[], float] = random.random) -> Iterator[float]:
        """An endless sequence of delays; `rand` returns a number in [0, 1)."""
        base = self.initial
        while True:
            yield base * (1.0 - self.jitter * rand())
            base = min(self.cap, base * self.factor)
