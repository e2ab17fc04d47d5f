"""Bad input and refused calls: the right status code, a one-line message naming the field,
and the group's state object untouched.

Matrix (request -> code, field in the message): ids that are not DNS-1123 labels, empty or
oversized; lease seconds negative, huge or NaN; weight and priority out of range; negative
device bytes; duplicate register; acquire with another job's lease, a wrong secret, an
unknown lease, a lease of another group, twice, with an oversized phase, for an unknown
group; yield by a non-holder; a malformed lease id; PutGroup without a spec or with bad
fields; every id, token and the session with a trailing newline; DeleteGroup of a held group without force; GetGroup of an unknown group;
RegisterAgent with a bad node or address; GetEvents with a negative limit. Also: Register
for an unknown group is NOT_FOUND when groups are not auto-created. (The holder's second
acquire changes one thing: the state records that its client was told it holds.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from rlslice.v1alpha1 import scheduler_pb2 as pb

if TYPE_CHECKING:
    from conftest import Live

C = grpc.StatusCode
Leases = dict[str, Any]


def _acq(job: str, lease: Any, group: str = "g", **kw: Any) -> pb.AcquireRequest:
    return pb.AcquireRequest(
        job=job, group=group, lease_id=lease.lease_id, secret=lease.secret, **kw
    )


CASES: list[tuple[str, str, Callable[[Leases], Any], C, str]] = [
    ("Register", "bad job id", lambda ls: pb.RegisterRequest(job="Bad_Name", group="g"), C.INVALID_ARGUMENT, "job"),
    ("Register", "empty group", lambda ls: pb.RegisterRequest(job="x", group=""), C.INVALID_ARGUMENT, "group"),
    ("Register", "oversized job id", lambda ls: pb.RegisterRequest(job="x" * 64, group="g"), C.INVALID_ARGUMENT, "job"),
    ("Register", "negative lease", lambda ls: pb.RegisterRequest(job="x", group="g", lease_seconds=-1), C.INVALID_ARGUMENT, "lease_seconds"),
    ("Register", "huge lease", lambda ls: pb.RegisterRequest(job="x", group="g", lease_seconds=1e9), C.INVALID_ARGUMENT, "lease_seconds"),
    ("Register", "NaN lease", lambda ls: pb.RegisterRequest(job="x", group="g", lease_seconds=float("nan")), C.INVALID_ARGUMENT, "lease_seconds"),
    ("Register", "zero weight", lambda ls: pb.RegisterRequest(job="x", group="g", weight=0), C.INVALID_ARGUMENT, "weight"),
    ("Register", "huge priority", lambda ls: pb.RegisterRequest(job="x", group="g", priority=5000), C.INVALID_ARGUMENT, "priority"),
    ("Register", "negative bytes", lambda ls: pb.RegisterRequest(job="x", group="g", device_bytes=-1), C.INVALID_ARGUMENT, "device_bytes"),
    ("Register", "duplicate", lambda ls: pb.RegisterRequest(job="a", group="g"), C.ALREADY_EXISTS, "job"),
    ("Acquire", "another job's lease", lambda ls: _acq("b", ls["a"]), C.PERMISSION_DENIED, "lease_id"),
    ("Acquire", "wrong secret", lambda ls: _acq("b", pb.RegisterResponse(lease_id=ls["b"].lease_id, secret="nope")), C.PERMISSION_DENIED, "secret"),
    ("Acquire", "unknown lease", lambda ls: _acq("b", pb.RegisterResponse(lease_id="abc123", secret="s")), C.NOT_FOUND, "lease_id"),
    ("Acquire", "lease of another group", lambda ls: _acq("b", ls["b"], group="h"), C.FAILED_PRECONDITION, "group"),
    ("Acquire", "duplicate", lambda ls: _acq("a", ls["a"]), C.ALREADY_EXISTS, "job"),
    ("Acquire", "oversized phase", lambda ls: _acq("b", ls["b"], phase="p" * 100), C.INVALID_ARGUMENT, "phase"),
    ("Acquire", "unknown group", lambda ls: _acq("b", ls["b"], group="nope"), C.NOT_FOUND, "group"),
    ("Acquire", "bad job id", lambda ls: _acq("B!", ls["b"]), C.INVALID_ARGUMENT, "job"),
    ("Yield", "non-holder", lambda ls: pb.YieldRequest(job="b", group="g", lease_id=ls["b"].lease_id, secret=ls["b"].secret), C.FAILED_PRECONDITION, "job"),
    ("KeepAlive", "malformed lease id", lambda ls: pb.KeepAliveRequest(lease_id="zz", secret="s"), C.INVALID_ARGUMENT, "lease_id"),
    ("KeepAlive", "empty secret", lambda ls: pb.KeepAliveRequest(lease_id=ls["a"].lease_id), C.INVALID_ARGUMENT, "secret"),
    ("Unregister", "wrong secret", lambda ls: pb.UnregisterRequest(lease_id=ls["a"].lease_id, secret="x"), C.PERMISSION_DENIED, "secret"),
    ("PutGroup", "no spec", lambda ls: pb.PutGroupRequest(), C.INVALID_ARGUMENT, "spec"),
    ("PutGroup", "bad name", lambda ls: pb.PutGroupRequest(spec=pb.GroupSpec(name="G!")), C.INVALID_ARGUMENT, "spec"),
    ("PutGroup", "lease too long", lambda ls: pb.PutGroupRequest(spec=pb.GroupSpec(name="g", lease_seconds=99999)), C.INVALID_ARGUMENT, "lease_seconds"),
    ("PutGroup", "unknown backend", lambda ls: pb.PutGroupRequest(spec=pb.GroupSpec(name="g", backend="magic")), C.INVALID_ARGUMENT, "backend"),
    ("DeleteGroup", "held, no force", lambda ls: pb.DeleteGroupRequest(group="g"), C.FAILED_PRECONDITION, "group"),
    ("GetGroup", "unknown group", lambda ls: pb.GetGroupRequest(group="nope"), C.NOT_FOUND, "group"),
    ("RegisterAgent", "bad node", lambda ls: pb.RegisterAgentRequest(node="N_1", address="127.0.0.1:1"), C.INVALID_ARGUMENT, "node"),
    ("RegisterAgent", "no address", lambda ls: pb.RegisterAgentRequest(node="n1"), C.INVALID_ARGUMENT, "address"),
    # A trailing newline passes `^...$` with re.match: every id and token is matched whole.
    ("Register", "job with a trailing newline", lambda ls: pb.RegisterRequest(job="x\n", group="g"), C.INVALID_ARGUMENT, "job"),
    ("Register", "group with a trailing newline", lambda ls: pb.RegisterRequest(job="x", group="g\n"), C.INVALID_ARGUMENT, "group"),
    ("Register", "session with a trailing newline", lambda ls: pb.RegisterRequest(job="x", group="g", session="s\n"), C.INVALID_ARGUMENT, "session"),
    ("KeepAlive", "lease id with a trailing newline", lambda ls: pb.KeepAliveRequest(lease_id=ls["a"].lease_id + "\n", secret=ls["a"].secret), C.INVALID_ARGUMENT, "lease_id"),
    ("PutGroup", "name with a trailing newline", lambda ls: pb.PutGroupRequest(spec=pb.GroupSpec(name="g\n")), C.INVALID_ARGUMENT, "spec"),
    ("RegisterAgent", "node with a trailing newline", lambda ls: pb.RegisterAgentRequest(node="n1\n", address="127.0.0.1:1"), C.INVALID_ARGUMENT, "node"),
    ("GetEvents", "negative limit", lambda ls: pb.GetEventsRequest(group="g", limit=-1), C.INVALID_ARGUMENT, "limit"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("method", "request_for", "code", "field"),
    [pytest.param(m, r, c, f, id=f"{m}: {name}") for m, name, r, c, f in CASES],
)
async def test_a_refused_request_gets_its_code_and_changes_nothing(
    live: Live, method: str, request_for: Callable[[Leases], Any], code: C, field: str
) -> None:
    leases = {"a": await live.register("a"), "b": await live.register("b")}
    await live.register("c", group="h")
    await live.acquire("a", leases["a"])
    before = {name: r.state for name, r in live.engine.groups.items()}
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await getattr(live.stub, method)(request_for(leases))
    assert caught.value.code() == code
    message = caught.value.details() or ""
    assert "\n" not in message
    assert message.startswith(field) or f"{field}:" in message
    after = {name: r.state for name, r in live.engine.groups.items()}
    if (method, code) == ("Acquire", C.ALREADY_EXISTS):
        # An answer to the holder: its client now knows it holds, which the state records
        # (a late lost-grant report must not undo it); nothing else changes.
        assert after["g"].acknowledged == ("a", before["g"].epoch)
        assert replace(after["g"], acknowledged=None) == before["g"]
        del after["g"], before["g"]
    assert after == before
    assert all(after[name] is before[name] for name in before)


async def test_register_for_an_unknown_group_is_not_found_without_auto_create(
    start_live: Callable[..., Any],
) -> None:
    async with start_live(auto_create_groups=False) as live:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await live.register("a", group="nope")
        assert caught.value.code() == C.NOT_FOUND
        assert live.engine.groups == {}
