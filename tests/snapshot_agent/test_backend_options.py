"""Backend options are validated models, refused with one line naming the field.

Case matrix:
- sim, per group: a number, "" (unset), an unknown key (ignored) -> the model's values;
  "abc", "nan", "inf", "-1" -> OptionsError starting with the field's name, on one line
- sim, agent level: defaults when nothing is set, a set value read
- cuda / cuda-checkpoint: a group's value wins over the agent's; "0" or "x" is a
  BackendError (the move fails, as before) naming the field
- cuda, agent level: sizes in units ("512MiB"); a copy mode, size or count it does not
  take is a BackendError "cuda: option <field>: ..."
- app, per move: "1" fences; the discard_tags option adds to the snapshot's own tags; an
  epoch that is not a count is refused (OptionsError) naming it
"""

from __future__ import annotations

import pytest

from rlslice.snapshot_agent.backends._checkpoint import CheckpointOptions, _move_options
from rlslice.snapshot_agent.backends._cuda_storage import cuda_options
from rlslice.snapshot_agent.backends._options import parse
from rlslice.snapshot_agent.backends.app import AppJobOptions, discard_tags
from rlslice.snapshot_agent.backends.base import BackendError, JobHandle, OptionsError
from rlslice.snapshot_agent.backends.sim import SimJobOptions, SimOptions


def test_a_groups_sim_options_are_read_and_the_empty_and_unknown_ones_left_out() -> None:
    asked = parse(SimJobOptions, {"rate_gbps": "2.5", "out_gbps": "", "fence": "1"})
    assert asked == SimJobOptions(rate_gbps=2.5)


@pytest.mark.parametrize("value", ["abc", "nan", "inf", "-1"])
def test_a_malformed_sim_option_is_refused_in_one_line_naming_it(value: str) -> None:
    with pytest.raises(OptionsError) as caught:
        parse(SimJobOptions, {"overhead_seconds": value})
    message = str(caught.value)
    assert message.startswith("overhead_seconds: ")
    assert repr(value) in message
    assert "\n" not in message


def test_the_agents_sim_options_default_when_nothing_is_set() -> None:
    options = parse(SimOptions, {})
    assert (options.devices, options.chunk_bytes, options.root) == (1, 64 << 20, "")
    assert options.rate_gbps is None
    assert parse(SimOptions, {"capacity_bytes": "1024"}).capacity_bytes == 1024


def test_a_groups_checkpoint_option_wins_over_the_agents() -> None:
    job = JobHandle("a", "g", (1,), options={"lock_timeout_ms": "20"})
    options = _move_options(job, {"lock_timeout_ms": "500", "rollback_seconds": "5"})
    assert (options.lock_timeout_ms, options.rollback_seconds) == (20, 5)


@pytest.mark.parametrize("value", ["0", "x"])
def test_a_malformed_checkpoint_option_fails_the_move_naming_it(value: str) -> None:
    with pytest.raises(BackendError, match=r"^rollback_seconds: ") as caught:
        parse(CheckpointOptions, {"rollback_seconds": value}, error=BackendError)
    assert not isinstance(caught.value, OptionsError)


def test_the_cuda_options_take_sizes_in_units() -> None:
    options = cuda_options({"pinned_pool_bytes": "512MiB", "copy": "driver", "threads": "2"})
    assert (options.pinned_pool_bytes, options.copy_mode, options.threads) == (
        512 << 20,
        "driver",
        2,
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [("copy", "fast"), ("chunk_bytes", "0"), ("ring_buffers", "x"), ("host_reserve_bytes", "lots")],
)
def test_a_cuda_option_it_does_not_take_is_refused_naming_it(field: str, value: str) -> None:
    with pytest.raises(BackendError, match=rf"^cuda: option {field}: "):
        cuda_options({field: value})


def test_an_app_move_reads_its_fence_and_discard_tags() -> None:
    assert parse(AppJobOptions, {"fence": "1"}).fence
    assert not parse(AppJobOptions, {}).fence
    job = JobHandle(
        "a", "g", (1,), discard_tags=("kv_cache",), options={"discard_tags": " draft, kv_cache"}
    )
    assert discard_tags(job) == ("kv_cache", "draft")


def test_an_app_epoch_that_is_not_a_count_is_refused_naming_it() -> None:
    with pytest.raises(OptionsError, match=r"^epoch: "):
        parse(AppJobOptions, {"epoch": "soon"})
