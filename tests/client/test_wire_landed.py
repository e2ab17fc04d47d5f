"""The wire tells a call that landed before an outage from one the scheduler refused.

A scripted stub stands in for the scheduler's channel: each call answers the next item of
its script (a reply, or a gRPC status). Cases:
- a Yield refused FAILED_PRECONDITION after an attempt found the scheduler unreachable had
  landed: it counts as given up; refused so at the first attempt, the error is raised;
- an Acquire refused ALREADY_EXISTS after an outage reads the grant back from GetGroup (with
  the discarded parts that grant told, the holder's `discarded_parts`), and raises the
  refusal when the job is not the holder there;
- a Register refused ALREADY_EXISTS at the first attempt is raised at once (no orphan);
- any failure comes out as its typed rlslice error (no wrapper to unwrap).
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from rlslice._errors import AlreadyExistsError, FailedPreconditionError, NotFoundError
from rlslice.client._results import Grant, YieldResult
from rlslice.v1alpha1 import scheduler_pb2 as pb

from .scripted import ScriptedLease as _Lease
from .scripted import scripted_wire as _wire


def _deadline() -> float:
    return asyncio.get_running_loop().time() + 5.0


async def test_a_yield_refused_after_an_outage_had_landed_and_counts_as_given_up() -> None:
    wire, stub = _wire(
        {"Yield": [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION]}
    )
    result = await wire.yield_(_Lease(), _deadline(), retry_seconds=None)
    assert result == YieldResult(0, False)
    assert stub.asked == ["Yield", "Yield"]


async def test_a_yield_refused_at_its_first_attempt_raises_the_typed_error() -> None:
    wire, _ = _wire({"Yield": [grpc.StatusCode.FAILED_PRECONDITION]})
    with pytest.raises(FailedPreconditionError, match="failed_precondition"):
        await wire.yield_(_Lease(), _deadline(), retry_seconds=None)


async def test_an_acquire_refused_after_an_outage_reads_its_grant_back() -> None:
    wire, stub = _wire(
        {
            "Acquire": [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ALREADY_EXISTS],
            "GetGroup": [pb.GroupStatus(holder="a", epoch=7)],
        }
    )
    started = asyncio.get_running_loop().time()
    grant = await wire.acquire(_Lease(), "train", _deadline(), started)
    assert (grant.epoch, grant.group, grant.job, grant.restored) == (7, "gpus", "a", False)
    assert grant.discarded == ()
    assert stub.asked == ["Acquire", "Acquire", "GetGroup"]


async def test_an_acquire_read_back_tells_the_parts_its_grant_discarded() -> None:
    holder = pb.JobStatus(job="a", state=pb.JOB_STATE_HOLDING, discarded_parts=["kv_cache"])
    parked = pb.JobStatus(job="b", state=pb.JOB_STATE_PARKED, discarded_parts=["graphs"])
    wire, _ = _wire(
        {
            "Acquire": [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ALREADY_EXISTS],
            "GetGroup": [pb.GroupStatus(holder="a", epoch=7, jobs=[parked, holder])],
        }
    )
    grant = await wire.acquire(_Lease(), "train", _deadline(), 0.0)
    assert (grant.epoch, grant.job, grant.discarded) == (7, "a", ("kv_cache",))


async def test_an_acquire_landed_for_another_holder_raises_the_refusal() -> None:
    wire, _ = _wire(
        {
            "Acquire": [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ALREADY_EXISTS],
            "GetGroup": [pb.GroupStatus(holder="b", epoch=8)],
        }
    )
    with pytest.raises(AlreadyExistsError):
        await wire.acquire(_Lease(), "train", _deadline(), 0.0)


async def test_an_answered_acquire_is_a_grant_of_the_lease_group() -> None:
    wire, _ = _wire({"Acquire": [pb.Grant(epoch=3, restored=True, moved_bytes=5)]})
    grant = await wire.acquire(_Lease(), "", _deadline(), 0.0)
    assert grant == Grant(3, 0.0, True, 0.0, 5, "gpus", "a")


async def test_a_register_refused_at_its_first_attempt_is_raised_at_once() -> None:
    wire, stub = _wire({"Register": [grpc.StatusCode.ALREADY_EXISTS]})
    with pytest.raises(AlreadyExistsError):
        await wire.register("gpus", _deadline())
    assert stub.asked == ["Register"]


async def test_an_unknown_lease_comes_out_as_not_found() -> None:
    wire, _ = _wire({"KeepAlive": [grpc.StatusCode.NOT_FOUND]})
    with pytest.raises(NotFoundError):
        await wire.keep_alive(_Lease(), _deadline())
