"""A job that leaves during a switch is never moved by a later attempt (pure core).

The switch under way was planned with the job among those to evict; the engine releases
the job's state only once that attempt ends. Cases: after the job unregisters (or its
lease lapses) mid-switch, the switch's `evict` and `candidates` no longer name it, so a
retry after a failed snapshot, or a resume after a scheduler restart, leaves it alone;
the release is still emitted (with force for an unregister, without for a lapse).
"""

from __future__ import annotations

import pytest

from rlslice.config import GroupSpec
from rlslice.scheduler.core import actions, events, new_group, step

NOW = 1000.0


def _run(state, event, now=NOW):  # type: ignore[no-untyped-def]
    transition = step(state, event, now)
    assert transition.state is not None
    return transition.state, transition.actions


@pytest.mark.parametrize("leaves", ["unregister", "lapse"])
def test_a_job_that_leaves_mid_switch_is_dropped_from_the_switch_plan(leaves: str) -> None:
    s = new_group(GroupSpec(name="g"))
    s, _ = _run(s, events.Register("a", "1", "h", 30.0, None, None, 0))
    s, _ = _run(
        s, events.Register("b", "2", "h", 1.0 if leaves == "lapse" else 30.0, None, None, 0)
    )
    s, _ = _run(s, events.Acquire("b", 1, ""))
    assert s.switch is not None
    s, _ = _run(s, events.SwitchDone(s.switch.epoch))  # b resident and holding
    s, _ = _run(s, events.Yield("b"))
    s, _ = _run(s, events.Acquire("a", 2, ""))  # switch to a: b is a candidate to evict
    assert s.switch is not None
    assert "b" in s.switch.candidates
    if leaves == "unregister":
        s, done = _run(s, events.Unregister("b"))
    else:
        s, done = _run(s, events.Tick(), now=NOW + 5)
    assert s.switch is not None
    assert "b" not in (*s.switch.evict, *s.switch.candidates)
    assert actions.ReleaseState("b", leaves == "unregister") in done
    # The attempt fails; its retry plans without b.
    s, done = _run(s, events.SnapshotFailed(s.switch.epoch, "injected"))
    retry = [x for x in done if isinstance(x, actions.StartSwitch)]
    assert retry
    assert "b" not in (*retry[0].switch.evict, *retry[0].switch.candidates)
