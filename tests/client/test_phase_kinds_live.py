"""Phase kinds, the RL policies and early yield against a real scheduler on loopback.

Cases:
- `lrs`: of two waiters, the job whose last hold ended longest ago is granted first, even
  though it queued second;
- `stage`: a waiting `train` is granted before a `rollout` that queued first;
- early yield: a `rollout` holder's phase learns `should_yield()` (and
  `wait_should_yield()` returns) once a `train` waits, the KeepAlive says why
  (`train_waiting`, no preemption: infinite seconds), and the callback hears it; the
  `train` holder it makes way for is never asked, though a `rollout` then waits;
- the sync client's phase sees the same request (`should_yield`, `wait_should_yield`);
- a PutGroup with an unknown phase kind is refused INVALID_ARGUMENT naming the field.
"""

from __future__ import annotations

import asyncio
import math

import grpc
import pytest

from rlslice import AsyncClient, Client
from rlslice.config import GroupSpec, PhaseKind, PhaseSpec, Policy
from rlslice.testing import TestScheduler, scheduler_for_tests
from rlslice.v1alpha1 import scheduler_pb2 as pb

from .conftest import eventually

PHASES = {
    "rollout": PhaseSpec(kind=PhaseKind.ROLLOUT, expected_seconds=60),
    "train": PhaseSpec(kind=PhaseKind.TRAIN, expected_seconds=20),
}
#: Short leases: a keep-alive every third of it, so a request to yield arrives quickly.
LEASE = 1.0


def _client(sched: TestScheduler, job: str, **kw: object) -> AsyncClient:
    return AsyncClient(job=job, group="gpus", scheduler=sched.address, lease_seconds=LEASE, **kw)  # type: ignore[arg-type]


async def test_lrs_grants_the_job_served_longest_ago_first() -> None:
    spec = GroupSpec(name="gpus", policy=Policy.LRS)
    async with (
        scheduler_for_tests(groups=[spec]) as sched,
        _client(sched, "a") as a,
        _client(sched, "b") as b,
        _client(sched, "c") as c,
    ):
        for client in (b, c, a):  # b's hold ends first, then c's; a holds now
            await client.acquire(phase="rollout")
            if client is not a:
                await client.yield_()
        c_waits = asyncio.create_task(c.acquire(phase="rollout"))
        await eventually(sched, "gpus", lambda s: list(s.queue) == ["c"], timeout=10)
        b_waits = asyncio.create_task(b.acquire(phase="rollout"))
        await eventually(sched, "gpus", lambda s: len(s.queue) == 2, timeout=10)
        await a.yield_()
        granted = await asyncio.wait_for(b_waits, 10)
        assert granted.job == "b"
        served = {j.job: j.last_served_at for j in (await sched.group("gpus")).jobs}
        assert 0 < served["b"] < served["c"] < served["a"]  # a's hold ended last
        assert not c_waits.done()
        assert list((await sched.group("gpus")).queue) == ["c"]
        await b.yield_()
        assert (await asyncio.wait_for(c_waits, 10)).job == "c"


async def test_stage_grants_a_waiting_train_before_an_earlier_rollout() -> None:
    spec = GroupSpec(name="gpus", policy=Policy.STAGE, phases=PHASES)
    async with (
        scheduler_for_tests(groups=[spec]) as sched,
        _client(sched, "a") as a,
        _client(sched, "b") as b,
        _client(sched, "c") as c,
    ):
        await a.acquire(phase="train")
        c_waits = asyncio.create_task(c.acquire(phase="rollout"))
        await eventually(sched, "gpus", lambda s: list(s.queue) == ["c"], timeout=10)
        b_waits = asyncio.create_task(b.acquire(phase="train"))
        # The scheduler reports the queue in policy order (the train first) and each
        # job's phase.
        status = await eventually(sched, "gpus", lambda s: list(s.queue) == ["b", "c"], timeout=10)
        assert {j.job: j.phase for j in status.jobs} == {"a": "train", "b": "train", "c": "rollout"}
        await a.yield_()
        assert (await asyncio.wait_for(b_waits, 10)).job == "b"
        assert not c_waits.done()
        await b.yield_()
        assert (await asyncio.wait_for(c_waits, 10)).job == "c"


async def _keepalive(sched: TestScheduler, client: AsyncClient) -> pb.KeepAliveResponse:
    lease = client._lease_of("gpus")
    assert lease is not None
    request = pb.KeepAliveRequest(lease_id=lease.lease_id, secret=lease.secret)
    return await sched._call("KeepAlive", request, pb.KeepAliveResponse)


@pytest.mark.parametrize("policy", [Policy.STAGE, Policy.FIFO])
async def test_a_rollout_holder_is_asked_to_yield_early_and_a_train_holder_never(
    policy: Policy,
) -> None:
    spec = GroupSpec(name="gpus", policy=policy, phases=PHASES)
    heard: asyncio.Queue[tuple[str, float]] = asyncio.Queue()

    async def on_yield_requested(group: str, preempt_in: float) -> None:
        await heard.put((group, preempt_in))

    async with (
        scheduler_for_tests(groups=[spec]) as sched,
        _client(sched, "a", on_yield_requested=on_yield_requested) as a,
        _client(sched, "b", on_yield_requested=on_yield_requested) as b,
    ):
        rollout = a.phase("rollout")
        async with rollout:
            assert not rollout.should_yield()
            assert (await _keepalive(sched, a)).yield_requested is False
            train_waits = asyncio.create_task(b.acquire(phase="train"))
            assert await rollout.wait_should_yield(timeout=10)
            assert rollout.should_yield()
            answer = await _keepalive(sched, a)
            assert answer.yield_requested
            assert answer.yield_reason == pb.YIELD_REASON_TRAIN_WAITING
            assert math.isinf(answer.preempt_in_seconds)
            group, preempt_in = await asyncio.wait_for(heard.get(), 10)
            assert group == "gpus"
            assert math.isinf(preempt_in)
            assert not train_waits.done()  # asked, never preempted: the rollout still holds
        assert (await asyncio.wait_for(train_waits, 10)).job == "b"
        # Now a rollout waits behind the train holder: the train is never asked.
        rollout_waits = asyncio.create_task(a.acquire(phase="rollout"))
        await eventually(sched, "gpus", lambda s: list(s.queue) == ["a"], timeout=10)
        assert not await b.wait_yield_requested(timeout=4 * LEASE)  # a dozen keep-alives
        answer = await _keepalive(sched, b)
        assert answer.yield_requested is False
        assert answer.yield_reason == pb.YIELD_REASON_UNSPECIFIED
        assert heard.empty()
        await b.yield_()
        assert (await asyncio.wait_for(rollout_waits, 10)).job == "a"
        assert not a.yield_requested()  # the request was about the earlier hold


async def test_the_sync_clients_rollout_phase_sees_the_request() -> None:
    spec = GroupSpec(name="gpus", policy=Policy.STAGE, phases=PHASES)
    async with scheduler_for_tests(groups=[spec]) as sched:
        loop = asyncio.get_running_loop()
        with (
            Client(job="a", group="gpus", scheduler=sched.address, lease_seconds=LEASE) as a,
            Client(job="b", group="gpus", scheduler=sched.address, lease_seconds=LEASE) as b,
        ):
            rollout = a.phase("rollout")
            await loop.run_in_executor(None, rollout.__enter__)
            assert not rollout.should_yield()
            train_waits = loop.run_in_executor(None, lambda: b.acquire(phase="train"))
            assert await loop.run_in_executor(None, lambda: rollout.wait_should_yield(10))
            assert rollout.should_yield()
            await loop.run_in_executor(None, rollout.__exit__, None, None, None)
            assert (await asyncio.wait_for(train_waits, 10)).job == "b"
            await loop.run_in_executor(None, b.yield_)


async def test_an_unknown_phase_kind_is_refused_naming_the_field() -> None:
    async with scheduler_for_tests() as sched:
        spec = pb.GroupSpec(name="gpus")
        spec.phases["rollout"].expected_seconds = 5  # kind left unset
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await sched._call("PutGroup", pb.PutGroupRequest(spec=spec), pb.GroupStatus)
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details() == (
            "spec.phases.rollout.kind: must be one of rollout, train, sync"
        )
