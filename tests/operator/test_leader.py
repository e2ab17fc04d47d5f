"""Leader election (pure rule and Lease adapter) and the scheduler on Kubernetes.

decide(): missing lease -> create and lead; own lease -> renew; someone else's live lease
-> wait; expired or released lease -> take over with transitions + 1.
Invariant (hypothesis): replicas stepping at random times never both lead at one instant.
Lease <-> record round trip; MicroTime formatting.
Against kmock (the emulated API server):
- two electors race for one Lease: exactly one leads
- two scheduler replicas: exactly one serves; the standby's health says NOT_SERVING for
  the Scheduler service and SERVING overall
- the leader holds a group with a holder, a waiter and an epoch; it dies without releasing
  -> the other takes over within the lease duration and reloads holder, queue, epoch
- a clean stop releases the lease -> the takeover is immediate
- the KubernetesStore writes ConfigMaps and reloads them; deletes remove them
"""

from __future__ import annotations

import asyncio

import grpc
import kmock
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import given, settings
from hypothesis import strategies as st

from rlslice.adapters.channel import open_channel
from rlslice.adapters.wire import group_spec_to_proto
from rlslice.config import GroupSpec
from rlslice.scheduler import SchedulerSettings
from rlslice.scheduler.core import GroupState
from rlslice.scheduler.leader import (
    ElectedScheduler,
    LeaseElector,
    LeaseRecord,
    Observation,
    decide,
    expired,
    format_time,
    lease_spec,
    observe,
    parse_time,
    record_from_lease,
    released,
)
from rlslice.scheduler.store.kubernetes import KubeAPI, KubernetesStore
from rlslice.v1alpha1 import scheduler_pb2, scheduler_pb2_grpc

from .conftest import eventually

NS = "rlslice"


@pytest.mark.parametrize(
    ("current", "now", "lapsed", "write", "create"),
    [
        (None, 100.0, False, LeaseRecord("a", 15, 100, 100, 0), True),
        (LeaseRecord("a", 15, 50, 90, 2), 100.0, False, LeaseRecord("a", 15, 50, 100, 2), False),
        (LeaseRecord("b", 15, 50, 90, 2), 100.0, False, None, False),
        # An old renewTime is no expiry: only our own observation is (see `expired`).
        (LeaseRecord("b", 15, 50, 1, 2), 100.0, False, None, False),
        (LeaseRecord("b", 15, 50, 99, 2), 100.0, True, LeaseRecord("a", 15, 100, 100, 3), False),
        (LeaseRecord("", 15, 50, 99, 2), 100.0, False, LeaseRecord("a", 15, 100, 100, 3), False),
    ],
    ids=["missing", "renew-own", "wait-for-live", "old-renew-time", "take-lapsed", "released"],
)
def test_the_election_rule(
    current: LeaseRecord | None,
    now: float,
    lapsed: bool,
    write: LeaseRecord | None,
    create: bool,
) -> None:
    decision = decide(current, "a", now, 15, lapsed)
    assert decision.write == write
    assert decision.create is create
    assert decision.leading is (write is not None)


def test_only_the_holder_can_release() -> None:
    record = LeaseRecord("a", 15, 0, 10, 1)
    assert released(record, "b", 11) is None
    handed = released(record, "a", 11)
    assert handed is not None
    assert handed.holder == ""
    assert handed.free


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from("ab"), st.floats(0, 20)), max_size=60))
def test_two_replicas_never_both_lead(steps: list[tuple[str, float]]) -> None:
    """Steps at random times against one atomically updated lease; each replica leads
    until its last successful write plus the renew deadline (2/3 of the lease)."""
    lease: LeaseRecord | None = None
    valid_until = {"a": -1.0, "b": -1.0}
    seen: dict[str, Observation | None] = {"a": None, "b": None}
    now = 0.0
    for who, gap in steps:
        now += gap
        lapsed = False
        if lease is not None and lease.holder not in ("", who):
            seen[who] = observe(seen[who], (lease.holder, lease.renewed), now)
            lapsed = expired(seen[who], now, lease.duration)
        decision = decide(lease, who, now, 15.0, lapsed)
        if decision.write is not None:
            lease = decision.write
            valid_until[who] = now + 10.0
        leaders = [r for r, until in valid_until.items() if now < until]
        assert len(leaders) <= 1, (leaders, lease)


def test_a_lease_round_trips_through_the_kubernetes_shape() -> None:
    record = LeaseRecord("a", 15, 1700000000.123456, 1700000001.5, 4)
    back = record_from_lease({"spec": lease_spec(record)})
    assert back.holder == "a"
    assert back.duration == 15
    assert back.transitions == 4
    assert abs(back.renewed - record.renewed) < 1e-5
    assert format_time(0) == "1970-01-01T00:00:00.000000Z"
    assert parse_time("1970-01-01T00:00:01.500000Z") == 1.5


@pytest.fixture
def cluster(
    kmock: kmock.KubernetesEmulator, monkeypatch: pytest.MonkeyPatch
) -> kmock.KubernetesEmulator:
    kmock.resources["coordination.k8s.io/v1/leases"] = kmock.ResourceInfo(
        kind="Lease", namespaced=True, verbs={"get", "create", "patch", "list"}
    )
    kmock.resources["v1/configmaps"] = kmock.ResourceInfo(
        kind="ConfigMap", namespaced=True, verbs={"get", "create", "patch", "list", "delete"}
    )
    monkeypatch.setenv("RLSLICE_KUBE_API", str(kmock.url))
    monkeypatch.setenv("RLSLICE_NAMESPACE", NS)
    return kmock


async def test_two_electors_racing_for_one_lease_elect_exactly_one(
    cluster: kmock.KubernetesEmulator,
) -> None:
    electors = [
        LeaseElector(KubeAPI(str(cluster.url)), NS, "race", name, duration=5) for name in "ab"
    ]
    results = await asyncio.gather(*(e.step() for e in electors))
    assert sorted(results) == [False, True]
    results = await asyncio.gather(*(e.step() for e in electors))  # renewal keeps it
    assert sorted(results) == [False, True]
    assert [e.leading for e in electors] == results
    for elector in electors:
        await elector.api.close()


async def test_the_store_keeps_groups_and_agents_in_configmaps(
    cluster: kmock.KubernetesEmulator,
) -> None:
    from rlslice.scheduler.store.base import AgentRecord

    store = KubernetesStore(KubeAPI(str(cluster.url)), NS, "t")
    state = GroupState(spec=GroupSpec(name="g1"), holder="", epoch=7)
    store.save_group(state)
    store.save_group(GroupState(spec=GroupSpec(name="g2")))
    store.save_agent(AgentRecord(node="n1", address="10.0.0.1:7071", labels={"gpu": "h200"}))
    await store.flush()
    assert (
        cluster.objects["v1/configmaps", NS, "t-group-g1"]["metadata"]["labels"][
            "rlslice.dev/store"
        ]
        == "t"
    )
    store.delete_group("g2")
    await store.flush()
    await store.close()

    again = KubernetesStore(KubeAPI(str(cluster.url)), NS, "t")
    loaded = await again.load()
    assert set(loaded.groups) == {"g1"}
    assert loaded.groups["g1"].epoch == 7
    assert loaded.agents["n1"].labels == {"gpu": "h200"}
    await again.close()


def replica_settings() -> SchedulerSettings:
    return SchedulerSettings(address="127.0.0.1:0", store="kubernetes:ha")


async def health_of(address: str, service: str) -> int:
    async with open_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        answer = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        return int(answer.status)


async def test_one_replica_serves_and_the_other_takes_over_with_the_state(
    cluster: kmock.KubernetesEmulator,
) -> None:
    replicas = [
        ElectedScheduler(
            replica_settings(),
            LeaseElector(
                KubeAPI(str(cluster.url)),
                NS,
                "rlslice-scheduler",
                name,
                duration=1.0,
                retry_period=0.1,
            ),
        )
        for name in ("a", "b")
    ]
    for replica in replicas:
        await replica.start()
    try:
        await eventually(lambda: any(r.leading for r in replicas), what="a leader")
        await asyncio.sleep(0.5)
        assert sum(r.leading for r in replicas) == 1
        leader = next(r for r in replicas if r.leading)
        standby = next(r for r in replicas if not r.leading)
        serving, not_serving = (
            health_pb2.HealthCheckResponse.SERVING,
            health_pb2.HealthCheckResponse.NOT_SERVING,
        )
        assert await health_of(standby.address, "rlslice.v1alpha1.Scheduler") == not_serving
        assert await health_of(standby.address, "") == serving
        assert await health_of(leader.address, "rlslice.v1alpha1.Scheduler") == serving

        async with open_channel(leader.address) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            await stub.PutGroup(
                scheduler_pb2.PutGroupRequest(
                    spec=group_spec_to_proto(GroupSpec(name="g", backend="sim"))
                )
            )
            holder = await stub.Register(
                scheduler_pb2.RegisterRequest(job="a", group="g", lease_seconds=60)
            )
            await stub.Acquire(
                scheduler_pb2.AcquireRequest(
                    job="a", group="g", lease_id=holder.lease_id, secret=holder.secret
                )
            )
            waiter = await stub.Register(
                scheduler_pb2.RegisterRequest(job="b", group="g", lease_seconds=60)
            )
            waiting = asyncio.ensure_future(
                stub.Acquire(
                    scheduler_pb2.AcquireRequest(
                        job="b", group="g", lease_id=waiter.lease_id, secret=waiter.secret
                    )
                )
            )

            async def queued() -> bool:
                status = await stub.GetGroup(scheduler_pb2.GetGroupRequest(group="g"))
                return list(status.queue) == ["b"]

            await eventually(queued, what="b queued")
            before = await stub.GetGroup(scheduler_pb2.GetGroupRequest(group="g"))

            # The leader dies while b waits (b's call is still open, so b stays queued).
            started = asyncio.get_running_loop().time()
            await leader.stop(release=False)  # no hand-over: the lease must expire
            with pytest.raises(grpc.RpcError):
                await waiting
        await eventually(lambda: standby.leading, timeout=5, what="takeover")
        took = asyncio.get_running_loop().time() - started
        assert took <= 1.0 + 0.7, took  # the lease duration, a retry period, a start

        async with open_channel(standby.address) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            after = await stub.GetGroup(scheduler_pb2.GetGroupRequest(group="g"))
        assert after.holder == before.holder == "a"
        assert list(after.queue) == list(before.queue) == ["b"]
        assert after.epoch == before.epoch
        assert {j.job for j in after.jobs} == {"a", "b"}
    finally:
        for replica in replicas:
            await replica.stop()


async def test_a_clean_stop_hands_the_lease_over_at_once(cluster: kmock.KubernetesEmulator) -> None:
    replicas = [
        ElectedScheduler(
            replica_settings(),
            LeaseElector(
                KubeAPI(str(cluster.url)), NS, "handover", name, duration=30, retry_period=0.1
            ),
        )
        for name in ("a", "b")
    ]
    for replica in replicas:
        await replica.start()
    try:
        await eventually(lambda: any(r.leading for r in replicas), what="a leader")
        leader = next(r for r in replicas if r.leading)
        other = next(r for r in replicas if not r.leading)
        await leader.stop(release=True)
        await eventually(lambda: other.leading, timeout=3, what="immediate takeover")
    finally:
        for replica in replicas:
            await replica.stop()
