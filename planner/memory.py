"""Device-memory arithmetic: model state, KV cache, sharding and per-phase peaks.

Numbers from the course module (seed 000 / 001):

- a 16-byte profile per trainable parameter is 2 (bf16 weight) + 2 (bf16 gradient)
  + 8 (two fp32 Adam moments) + 4 (fp32 master copy): full training of 7B needs 112 GB;
- LoRA with 20 M trainable parameters on a 7B base: 14 GB of bf16 base weights plus
  0.32 GB for the adapters' weights, gradients, moments and master copies, 14.32 GB;
- KV cache of 64 sequences x 4096 tokens, 32 layers, 8 KV heads of 128, bf16:
  128 KiB per token, 262,144 tokens, 32 GiB; ideally sharded over 4, 8 GiB.

These are payloads: allocator pages, block tables, alignment and temporary tensors come on top.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rlslice._errors import InvalidArgumentError
from rlslice.planner import _checks
from rlslice.units import format_bytes

#: One gibibyte, 2**30 bytes.
BYTES_PER_GIB = 1024**3


def human_bytes(count: int | float) -> str:
    """`count` bytes in binary units with two decimals: `human_bytes(16 * 2**30) == "16.00 GiB"`.

    `rlslice.units.format_bytes` after the planner's argument check (finite, not negative).
    """
    return format_bytes(_checks.real("count", count, minimum=0))


@dataclass(frozen=True)
class ModelState:
    """Logical bytes of a model's training state, by part."""

    total_parameters: int
    trainable_parameters: int
    #: every parameter's stored value (base weights and adapters)
    parameter_bytes_total: int
    #: gradients of the trainable parameters
    gradient_bytes_total: int
    #: optimizer state (two fp32 Adam moments: 8 bytes per trainable parameter)
    optimizer_bytes_total: int
    #: fp32 master copies of the trainable parameters
    master_bytes_total: int

    @property
    def trainable_extra_bytes(self) -> int:
        """Bytes that exist only because parameters are trained."""
        return self.gradient_bytes_total + self.optimizer_bytes_total + self.master_bytes_total

    @property
    def total_bytes(self) -> int:
        """Everything: parameters plus the trainable extras."""
        return self.parameter_bytes_total + self.trainable_extra_bytes

    @property
    def bytes_per_trainable_parameter(self) -> float:
        """Bytes per trainable parameter, counting its own stored value (16 for the common profile)."""
        if self.trainable_parameters == 0:
            return 0.0
        own = self.parameter_bytes_total / self.total_parameters
        return own + self.trainable_extra_bytes / self.trainable_parameters

    def __int__(self) -> int:
        return self.total_bytes


def model_state_bytes(
    total_parameters: int,
    trainable_parameters: int | None = None,
    parameter_bytes: int = 2,
    gradient_bytes: int = 2,
    optimizer_state_bytes: int = 8,
    master_parameter_bytes: int = 4,
) -> ModelState:
    """Bytes of weights, gradients, optimizer state and master copies.

    `trainable_parameters` defaults to all of them (full training). Every argument is an
    integer count or a byte width per parameter.

    >>> model_state_bytes(7_000_000_000, 7_000_000_000, 2, 2, 8, 4).total_bytes
    112000000000
    >>> model_state_bytes(7_020_000_000, 20_000_000, 2, 2, 8, 4).total_bytes
    14320000000
    """
    total = _checks.integer("total_parameters", total_parameters, minimum=1)
    trainable = (
        total
        if trainable_parameters is None
        else _checks.integer("trainable_parameters", trainable_parameters, minimum=0)
    )
    if trainable > total:
        raise InvalidArgumentError(
            f"trainable_parameters must not exceed total_parameters ({total}), got {trainable}"
        )
    widths = {
        "parameter_bytes": parameter_bytes,
        "gradient_bytes": gradient_bytes,
        "optimizer_state_bytes": optimizer_state_bytes,
        "master_parameter_bytes": master_parameter_bytes,
    }
    checked = {key: _checks.integer(key, value, minimum=0) for key, value in widths.items()}
    return ModelState(
        total_parameters=total,
        trainable_parameters=trainable,
        parameter_bytes_total=total * checked["parameter_bytes"],
        gradient_bytes_total=trainable * checked["gradient_bytes"],
        optimizer_bytes_total=trainable * checked["optimizer_state_bytes"],
        master_bytes_total=trainable * checked["master_parameter_bytes"],
    )


def ideal_sharded_memory(total_bytes: int, participants: int) -> int:
    """Bytes per participant under ideal even sharding (FSDP), rounded up.

    Ignores replicated objects, modules gathered for a layer, communication buffers,
    activations, logits, fragmentation and the moment of synchronization.
    `ideal_sharded_memory(32 * BYTES_PER_GIB, 4) == 8 * BYTES_PER_GIB`.
    """
    total = _checks.integer("total_bytes", total_bytes, minimum=0)
    count = _checks.integer("participants", participants, minimum=1)
    return -(-total // count)


def kv_cache_bytes(
    num_sequences: int,
    tokens_per_sequence: int,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    element_bytes: int,
) -> int:
    """Payload of the key-value cache: 2 (K and V) x sequences x tokens x layers x heads x dim x width.

    `kv_cache_bytes(64, 4096, 32, 8, 128, 2) == 32 * BYTES_PER_GIB` (128 KiB per token).
    """
    dims = {
        "num_sequences": num_sequences,
        "tokens_per_sequence": tokens_per_sequence,
        "num_layers": num_layers,
        "num_kv_heads": num_kv_heads,
        "head_dim": head_dim,
        "element_bytes": element_bytes,
    }
    product = 2
    for key, value in dims.items():
        product *= _checks.integer(key, value, minimum=1)
    return product


@dataclass(frozen=True)
class PeakMemory:
    """The phase with the largest device footprint, and every phase's total."""

    phase: str
    peak_bytes: int
    phase_totals: Mapping[str, int]


def peak_memory(phases: Mapping[str, Sequence[int]]) -> PeakMemory:
    """Sum each phase's resident parts and name the largest (the first one on a tie).

    Memory peaks per phase, not per sum of everything a job ever holds: rollout holds
    weights and KV cache, training holds weights, optimizer state and activations.
    """
    if not isinstance(phases, Mapping) or not phases:
        raise InvalidArgumentError("phases must be a non-empty mapping of phase -> byte counts")
    totals: dict[str, int] = {}
    for phase, parts in phases.items():
        _checks.name("phases key", phase)
        if isinstance(parts, str | bytes) or not isinstance(parts, Sequence):
            raise InvalidArgumentError(f"phases[{phase!r}] must be a sequence of byte counts")
        totals[phase] = sum(
            _checks.integer(f"phases[{phase!r}][{i}]", part, minimum=0)
            for i, part in enumerate(parts)
        )
    peak_phase = max(totals, key=lambda key: totals[key])
    return PeakMemory(phase=peak_phase, peak_bytes=totals[peak_phase], phase_totals=totals)
