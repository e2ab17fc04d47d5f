"""The lease secret binds Acquire, Yield, KeepAlive and Unregister to the job that registered.

Job a holds group g; job b is registered too, and tries everything a stranger with some of
a's credentials could (table): a's lease id with a wrong secret, b's own lease under a's
name, a's lease under b's name, a's lease in another group, b yielding for a. Each is
refused with the right code and a one-line message naming the field, and the group is
exactly as before (a still holds, nobody queued, same epoch, same leases).
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from rlslice.adapters.channel import open_channel
from rlslice.v1alpha1 import scheduler_pb2 as pb
from rlslice.v1alpha1 import scheduler_pb2_grpc

from .conftest import scheduler

DENIED = grpc.StatusCode.PERMISSION_DENIED
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION


def _attempts(a: Any, b: Any, other: Any) -> list[tuple[str, str, Any, grpc.StatusCode, str]]:
    wrong = "x" * 43
    return [
        ("acquire as a, wrong secret", "Acquire", pb.AcquireRequest(job="a", group="g", lease_id=a.lease_id, secret=wrong), DENIED, "secret"),
        ("yield as a, wrong secret", "Yield", pb.YieldRequest(job="a", group="g", lease_id=a.lease_id, secret=wrong), DENIED, "secret"),
        ("yield as a with b's lease", "Yield", pb.YieldRequest(job="a", group="g", lease_id=b.lease_id, secret=b.secret), DENIED, "lease_id"),
        ("acquire as b with a's lease", "Acquire", pb.AcquireRequest(job="b", group="g", lease_id=a.lease_id, secret=a.secret), DENIED, "lease_id"),
        ("yield by b, who does not hold", "Yield", pb.YieldRequest(job="b", group="g", lease_id=b.lease_id, secret=b.secret), PRECONDITION, "job"),
        ("a's lease in another group", "Yield", pb.YieldRequest(job="a", group="h", lease_id=a.lease_id, secret=a.secret), PRECONDITION, "group"),
        ("acquire in g with a lease of h", "Acquire", pb.AcquireRequest(job="a", group="g", lease_id=other.lease_id, secret=other.secret), PRECONDITION, "group"),
        ("keep a's lease alive, wrong secret", "KeepAlive", pb.KeepAliveRequest(lease_id=a.lease_id, secret=wrong), DENIED, "secret"),
        ("unregister a, wrong secret", "Unregister", pb.UnregisterRequest(lease_id=a.lease_id, secret=wrong), DENIED, "secret"),
    ]  # fmt: skip


@pytest.mark.parametrize("index", range(9))
async def test_a_stranger_cannot_act_with_another_jobs_lease(index: int) -> None:
    async with (
        scheduler(auto_create_groups=True) as running,
        open_channel(running.address) as channel,
    ):
        stub: Any = scheduler_pb2_grpc.SchedulerStub(channel)
        a = await stub.Register(pb.RegisterRequest(job="a", group="g"))
        b = await stub.Register(pb.RegisterRequest(job="b", group="g"))
        other = await stub.Register(pb.RegisterRequest(job="a", group="h"))
        await stub.Acquire(
            pb.AcquireRequest(job="a", group="g", lease_id=a.lease_id, secret=a.secret)
        )
        before = {n: r.state for n, r in running.engine.groups.items()}
        what, method, request, code, field = _attempts(a, b, other)[index]
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await getattr(stub, method)(request, timeout=5)
        assert caught.value.code() == code, what
        details = caught.value.details() or ""
        assert details.startswith(f"{field}:"), (what, details)
        assert "\n" not in details
        assert {n: r.state for n, r in running.engine.groups.items()} == before, what
        assert running.engine.groups["g"].state.holder == "a"


async def test_the_secret_is_never_stored_only_its_hash() -> None:
    async with scheduler(auto_create_groups=True) as running:
        async with open_channel(running.address) as channel:
            stub: Any = scheduler_pb2_grpc.SchedulerStub(channel)
            a = await stub.Register(pb.RegisterRequest(job="a", group="g"))
        record = running.engine.groups["g"].state.jobs["a"]
        assert a.secret not in repr(record)
        assert len(a.secret) >= 32
        assert record.secret_hash != a.secret
