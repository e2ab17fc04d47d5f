"""Memory arithmetic: every number of the course module, and refusals of bad input.

Cases: the 16-byte profile (112 GB), the 12-byte profile, LoRA 14.32 GB, 1 % adapters;
KV cache 128 KiB/token, 32 GiB, 16 GiB with 4 KV heads, x4 for 8 -> 32 sequences;
ideal sharding over 4 (8 GiB); per-phase peaks (training 50 GiB); human_bytes; bools,
floats, negatives and non-finite numbers are refused naming the argument; parts always
sum to the total (property).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlslice.planner import (
    BYTES_PER_GIB,
    human_bytes,
    ideal_sharded_memory,
    kv_cache_bytes,
    model_state_bytes,
    peak_memory,
)


def test_full_training_of_7b_with_the_16_byte_profile_needs_112_gb() -> None:
    state = model_state_bytes(7_000_000_000, 7_000_000_000, 2, 2, 8, 4)
    assert state.total_bytes == 112_000_000_000
    assert int(state) == 112_000_000_000
    assert state.bytes_per_trainable_parameter == 16
    assert state.parameter_bytes_total == 14_000_000_000  # the bf16 base weights: 14 GB


def test_lora_with_20m_trainable_parameters_on_7b_needs_14_32_gb() -> None:
    state = model_state_bytes(7_020_000_000, 20_000_000, 2, 2, 8, 4)
    assert state.total_bytes == 14_320_000_000
    # each trainable parameter: its own weight, gradient, two moments and a master copy
    assert state.trainable_extra_bytes + 20_000_000 * 2 == 320_000_000


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"master_parameter_bytes": 0}, 84_000_000_000),
        ({"master_parameter_bytes": 4}, 112_000_000_000),
    ],
)
def test_the_notebook_profiles_take_keyword_byte_widths(
    kwargs: dict[str, int], expected: int
) -> None:
    state = model_state_bytes(
        7_000_000_000, parameter_bytes=2, gradient_bytes=2, optimizer_state_bytes=8, **kwargs
    )
    assert state.total_bytes == expected


def test_one_percent_adapters_on_7b_need_15_12_gb() -> None:
    state = model_state_bytes(
        7_070_000_000,
        trainable_parameters=70_000_000,
        parameter_bytes=2,
        gradient_bytes=2,
        optimizer_state_bytes=8,
        master_parameter_bytes=4,
    )
    assert state.total_bytes == 15_120_000_000


def test_the_kv_cache_takes_128_kib_per_token_and_32_gib_for_64_sequences_of_4096() -> None:
    assert kv_cache_bytes(1, 1, 32, 8, 128, 2) == 128 * 1024
    assert kv_cache_bytes(64, 4096, 32, 8, 128, 2) == 32 * 1024**3
    assert 64 * 4096 == 262_144


def test_the_notebook_kv_cache_with_4_heads_is_16_gib() -> None:
    kv = kv_cache_bytes(
        num_sequences=64,
        tokens_per_sequence=4096,
        num_layers=32,
        num_kv_heads=4,
        head_dim=128,
        element_bytes=2,
    )
    assert kv == 16 * BYTES_PER_GIB


def test_grpo_going_from_8_to_32_active_sequences_quadruples_the_kv_cache() -> None:
    assert kv_cache_bytes(32, 4096, 32, 8, 128, 2) == 4 * kv_cache_bytes(8, 4096, 32, 8, 128, 2)


def test_ideal_sharding_of_32_gib_over_four_participants_is_8_gib() -> None:
    assert ideal_sharded_memory(32 * BYTES_PER_GIB, 4) == 8 * BYTES_PER_GIB
    assert ideal_sharded_memory(10, 4) == 3  # rounded up: a participant holds whole bytes


def test_training_is_the_peak_phase_at_50_gib() -> None:
    report = peak_memory(
        {
            "rollout": [14 * BYTES_PER_GIB, 16 * BYTES_PER_GIB, 2 * BYTES_PER_GIB],
            "training": [14 * BYTES_PER_GIB, 8 * BYTES_PER_GIB, 28 * BYTES_PER_GIB],
            "weight publication": [14 * BYTES_PER_GIB, 14 * BYTES_PER_GIB, 2 * BYTES_PER_GIB],
        }
    )
    assert report.phase == "training"
    assert report.peak_bytes == 50 * BYTES_PER_GIB
    assert report.phase_totals == {
        "rollout": 32 * BYTES_PER_GIB,
        "training": 50 * BYTES_PER_GIB,
        "weight publication": 30 * BYTES_PER_GIB,
    }


@pytest.mark.parametrize(
    ("count", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (16 * BYTES_PER_GIB, "16.00 GiB"),
        (112_000_000_000, "104.31 GiB"),
        (1024**6, "1024.00 PiB"),
    ],
)
def test_human_bytes_uses_binary_units(count: int, text: str) -> None:
    assert human_bytes(count) == text


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: model_state_bytes(True), "total_parameters"),
        (lambda: model_state_bytes(7.0e9), "total_parameters"),  # type: ignore[arg-type]
        (lambda: model_state_bytes(0), "total_parameters"),
        (lambda: model_state_bytes(10, 11), "trainable_parameters"),
        (lambda: model_state_bytes(10, -1), "trainable_parameters"),
        (lambda: model_state_bytes(10, parameter_bytes=-2), "parameter_bytes"),
        (lambda: model_state_bytes(10, gradient_bytes=False), "gradient_bytes"),
        (lambda: kv_cache_bytes(64, 4096, 32, 8, 128, 0), "element_bytes"),
        (lambda: kv_cache_bytes(64, True, 32, 8, 128, 2), "tokens_per_sequence"),
        (lambda: ideal_sharded_memory(100, 0), "participants"),
        (lambda: human_bytes(math.inf), "count"),
        (lambda: human_bytes(math.nan), "count"),
        (lambda: human_bytes(-1), "count"),
        (lambda: peak_memory({}), "phases"),
        (lambda: peak_memory({"rollout": [1, True]}), "rollout"),
        (lambda: peak_memory({"rollout": "12"}), "rollout"),
    ],
)
def test_bad_input_raises_a_value_error_naming_the_argument(call: object, argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        call()  # type: ignore[operator]


@given(
    total=st.integers(1, 10**12),
    share=st.floats(0, 1),
    widths=st.tuples(*[st.integers(0, 16)] * 4),
)
def test_the_parts_always_add_up_to_the_total(
    total: int, share: float, widths: tuple[int, int, int, int]
) -> None:
    trainable = int(total * share)
    state = model_state_bytes(total, trainable, *widths)
    p, g, o, m = widths
    assert state.total_bytes == total * p + trainable * (g + o + m)
    assert state.total_bytes >= state.parameter_bytes_total
