"""The wire reads a grant's discarded parts (issue 26): the tags the scheduler's Grant
names come out as `Grant.discarded`, in order; a Grant that names none gives ()."""

from __future__ import annotations

import asyncio

from rlslice.v1alpha1 import scheduler_pb2 as pb

from .scripted import ScriptedLease as _Lease
from .scripted import scripted_wire as _wire


def _deadline() -> float:
    return asyncio.get_running_loop().time() + 5.0


async def test_a_grant_naming_discarded_parts_gives_their_tags_in_order() -> None:
    wire, _ = _wire({"Acquire": [pb.Grant(epoch=4, discarded=["kv_cache", "graphs"])]})
    grant = await wire.acquire(_Lease(), "", _deadline(), 0.0)
    assert grant.discarded == ("kv_cache", "graphs")
    assert grant.epoch == 4


async def test_a_grant_naming_none_gives_an_empty_tuple() -> None:
    wire, _ = _wire({"Acquire": [pb.Grant(epoch=5)]})
    grant = await wire.acquire(_Lease(), "", _deadline(), 0.0)
    assert grant.discarded == ()
