"""Order statistics shared by the profiles and the benches: the one percentile. Pure.

Two conventions, both common, and the caller names which it means:

- `"linear"` interpolates between the two order statistics around the rank
  `p/100 * (n - 1)` (numpy's default, R's type 7): the median of an even count is the mean
  of the middle two. Profiles (`rlslice.planner.profile`) and `bench handoff` use it.
- `"nearest-rank"` is the smallest value with at least `p`% of the values at or below it,
  always one of the samples. `bench scale` uses it for its latency figures.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal

__all__ = ["Method", "percentile"]

Method = Literal["linear", "nearest-rank"]


def percentile(values: Iterable[float], p: float, *, method: Method = "linear") -> float:
    """The `p`-th percentile (`p` in 0..100) of `values`; 0.0 for no values.

    >>> percentile([1.0, 2.0, 3.0, 4.0], 50)
    2.5
    >>> percentile([1.0, 2.0, 3.0, 4.0], 50, method="nearest-rank")
    2.0
    """
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be within 0..100, got {p!r}")
    ordered = sorted(values)
    if not ordered:
        return 0.0
    if method == "nearest-rank":
        # ceil(n * p / 100), exact for a whole p; at least the first value.
        rank = max(1, min(len(ordered), -(-len(ordered) * p // 100)))
        return ordered[int(rank) - 1]
    position = p / 100 * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
