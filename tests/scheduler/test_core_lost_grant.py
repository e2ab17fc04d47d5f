"""The lost-grant state lives in the group state machine.

Cases: the holder's re-issued acquire is answered ALREADY_EXISTS and recorded as
acknowledged (its client now knows it holds); a grant whose caller left unread is yielded
for the job and served to the next waiter; a lost grant after the acknowledgement changes
nothing; a stale lost grant (an older epoch, or another job) changes nothing; the
acknowledgement ends with the hold, so a later hold's lost grant yields again; the store's
codec keeps it and decodes data stored before it existed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rlslice._errors import AlreadyExistsError
from rlslice.scheduler.core import actions, events
from rlslice.scheduler.store.codec import decode_group, encode_group

if TYPE_CHECKING:
    from conftest import Driver


def _a_holding_b_waiting(new: Callable[..., Driver]) -> Driver:
    d = new()
    d.register("a")
    d.register("b")
    d.acquire("a")
    d.finish_switch()
    d.acquire("b")
    return d


def test_the_holders_reissued_acquire_is_answered_already_exists_and_acknowledged(
    new: Callable[..., Driver],
) -> None:
    d = _a_holding_b_waiting(new)
    ticket = d.acquire("a")
    assert [f.kind for f in d.fails if f.ticket == ticket] == [AlreadyExistsError]
    assert ticket not in d.open_calls
    assert d.state.acknowledged == ("a", d.state.epoch)
    assert d.state.holder == "a"


def test_a_grant_whose_caller_left_is_yielded_to_the_next_waiter(
    new: Callable[..., Driver],
) -> None:
    d = _a_holding_b_waiting(new)
    done = d.apply(events.LostGrant("a", d.state.epoch))
    assert any(isinstance(x, actions.Yielded) and x.job == "a" for x in done)
    assert d.state.holder is None
    assert d.state.switch is not None
    assert d.state.switch.incoming == "b"


def test_a_lost_grant_after_the_acknowledgement_changes_nothing(
    new: Callable[..., Driver],
) -> None:
    d = _a_holding_b_waiting(new)
    d.acquire("a")
    before = d.state
    assert d.apply(events.LostGrant("a", before.epoch)) == ()
    assert d.state is before


def test_a_stale_lost_grant_changes_nothing(new: Callable[..., Driver]) -> None:
    d = _a_holding_b_waiting(new)
    before = d.state
    assert d.apply(events.LostGrant("a", before.epoch - 1)) == ()
    assert d.apply(events.LostGrant("b", before.epoch)) == ()
    assert d.state is before


def test_the_acknowledgement_ends_with_the_hold(new: Callable[..., Driver]) -> None:
    d = new()
    d.register("a")
    d.acquire("a")
    d.finish_switch()
    d.acquire("a")  # acknowledged
    d.apply(events.Yield("a"))
    assert d.state.acknowledged is None
    d.acquire("a")  # resident: granted at once, a new hold
    assert d.state.holder == "a"
    done = d.apply(events.LostGrant("a", d.state.epoch))
    assert any(isinstance(x, actions.Yielded) for x in done)
    assert d.state.holder is None


def test_the_codec_keeps_the_acknowledgement_and_reads_data_stored_before_it(
    new: Callable[..., Driver],
) -> None:
    d = _a_holding_b_waiting(new)
    d.acquire("a")
    assert decode_group(encode_group(d.state)) == d.state
    old = encode_group(d.state)
    del old["acknowledged"]
    assert decode_group(old).acknowledged is None
