"""One transition under way: the evolving state and the actions it emits (`_Tx`), and
`_evolve`, the fast `dataclasses.replace` every handler's change goes through.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any

from rlslice.scheduler.core import actions as a
from rlslice.scheduler.core.actions import Kind
from rlslice.scheduler.core.state import GroupState

_STATE_FIELDS = GroupState.__slots__
# `_evolve` skips `__init__`: it would also have to call this if GroupState ever had one.
assert not hasattr(GroupState, "__post_init__")
_STATE_FIELD_SET = frozenset(_STATE_FIELDS)
_state_values = attrgetter(*_STATE_FIELDS)
_new = object.__new__
_setattr = object.__setattr__


def _evolve(state: GroupState, changes: dict[str, Any]) -> GroupState:
    """`dataclasses.replace(state, **changes)`, about three times faster: every transition
    makes a few of these. GroupState has no `__post_init__` and every field is an init
    field, so filling the slots directly builds the same value `replace` would. Where jobs
    are placed changes through `placement` (a `PlacementMap` operation), never its views."""
    unknown = changes.keys() - _STATE_FIELD_SET
    if unknown:
        raise TypeError(f"GroupState has no field {sorted(unknown)[0]!r}")
    new = _new(GroupState)
    for name, value in zip(_STATE_FIELDS, _state_values(state), strict=True):
        _setattr(new, name, changes.get(name, value))
    return new


class _Tx:
    """Accumulates one transition: the evolving state and the actions, in order."""

    __slots__ = ("actions", "deleted", "now", "s")

    def __init__(self, state: GroupState, now: float) -> None:
        self.s = state
        self.now = now
        self.actions: list[a.Action] = []
        self.deleted = False

    def set(self, **changes: Any) -> None:
        self.s = _evolve(self.s, changes)

    def emit(self, action: a.Action) -> None:
        self.actions.append(action)

    def record(
        self, kind: Kind, job: str = "", detail: str = "", seconds: float = 0.0, nbytes: int = 0
    ) -> None:
        self.actions.append(a.Record(kind, job, detail, seconds, nbytes))
