"""The core's fast state copy (`_Tx.set`) builds exactly what `dataclasses.replace` would.

Cases: any subset of fields changed to any values (hypothesis) gives an equal state, the
original untouched; an unknown field is a TypeError, as with `replace`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlslice.config import GroupSpec, Policy
from rlslice.scheduler.core import GroupState, JobRecord, Switch, Waiter
from rlslice.scheduler.core._tx import _evolve
from rlslice.scheduler.core.placement import place

BASE = GroupState(
    spec=GroupSpec(name="g"),
    jobs={"a": JobRecord("a", "l", "h", 10.0, 20.0)},
    holder="a",
    queue=(Waiter("b", 1, 3.0),),
    placement=place(("a",)),
)
names = st.text("abc", min_size=1, max_size=2)
changes = st.fixed_dictionaries(
    {},
    optional={
        "spec": st.sampled_from([GroupSpec(name="g", policy=p) for p in Policy]),
        "jobs": st.dictionaries(names, st.builds(JobRecord, names, names, names, st.floats(allow_nan=False))),
        "holder": st.none() | names,
        "holder_since": st.floats(allow_nan=False),
        "queue": st.lists(st.builds(Waiter, names, st.integers(), st.floats(0, 9))).map(tuple),
        "placement": st.builds(place, st.lists(names), st.lists(names), st.dictionaries(names, names)),
        "epoch": st.integers(0),
        "switch": st.none()
        | st.builds(Switch, names, st.none(), st.just(1.0), st.just(()), st.just(()),
                    st.booleans(), st.integers(), st.integers(), st.integers(), st.just(2.0)),
        "yield_requested_at": st.none() | st.floats(allow_nan=False),
        "preempted": st.frozensets(names),
        "switches": st.integers(0),
        "last_switch_seconds": st.floats(allow_nan=False),
        "last_switch_at": st.floats(allow_nan=False),
    },
)  # fmt: skip


@given(changes)
def test_evolve_builds_what_replace_builds(changed: dict[str, Any]) -> None:
    before = replace(BASE)
    assert _evolve(BASE, changed) == replace(BASE, **changed)
    assert before == BASE


def test_an_unknown_field_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="holdr"):
        _evolve(BASE, {"holdr": "b"})
