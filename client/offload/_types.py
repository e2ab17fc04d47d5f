"""What every offloader is: modes, tags, and two calls the workload loop makes; and what
one that splits its state into parts adds (`PartialOffloader`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

OFFLOAD = "offload"
"""Copy to host memory and back: contents survive."""
DISCARD = "discard"
"""Free without copying (a KV cache): contents come back zero-filled or rebuilt."""
MODES = frozenset({OFFLOAD, DISCARD})


@dataclass(frozen=True)
class OffloadResult:
    """What one offload or restore did."""

    bytes: int
    """Device bytes moved to or from host memory, plus bytes freed by DISCARD."""
    seconds: float
    """Wall seconds the call took."""


@runtime_checkable
class Offloader(Protocol):
    """Something in a workload that can give its device memory back and take it again.

    Calls are blocking; the workload loop runs them in a thread. `offload` either moves
    everything or raises with nothing moved; `restore` with nothing offloaded is a no-op.
    """

    @property
    def modes(self) -> frozenset[str]:
        """Subset of {"offload", "discard"}."""
        ...

    @property
    def tags(self) -> tuple[str, ...]:
        """Tags the memory is registered under."""
        ...

    def offload(self, discard_tags: Sequence[str] = ()) -> OffloadResult:
        """Free device memory; tags in `discard_tags` are dropped instead of copied."""
        ...

    def restore(self) -> OffloadResult:
        """Bring back what `offload` freed."""
        ...


@runtime_checkable
class PartialOffloader(Offloader, Protocol):
    """An offloader that moves its tags separately (a partial offload, issue 26): it sets
    `splits_parts = True` and its `offload` takes `offload_tags`. The workload loop moves
    any other offloader whole, and only when a partial command names all its tags."""

    splits_parts: bool

    def offload(
        self, discard_tags: Sequence[str] = (), *, offload_tags: Sequence[str] | None = None
    ) -> OffloadResult:
        """As `Offloader.offload` for `offload_tags` None; otherwise copy only the tags of
        `offload_tags`, free those of `discard_tags`, leave every other tag resident, and
        count the bytes copied."""
        ...
