"""Backend options are validated models, refused with one line naming the field.

Case matrix:
- sim, per group: a number, "" (unset), an unknown key (ignored) -> the model's values;
  "abc", "nan", "inf", "-1" -> OptionsError starting with the field's name, on one line
- sim, agent level: defaults when nothing is set, a set value read
"""

from __future__ import annotations

import pytest

from rlslice.snapshot_agent.backends._options import parse
from rlslice.snapshot_agent.backends.base import OptionsError
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
