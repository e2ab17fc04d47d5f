"""`rlslice scheduler --leader-elect`: the command's wiring of leader election, against kmock.

- the flags (and POD_NAME, RLSLICE_NAMESPACE) build an `Election` and an `ElectedScheduler`
  whose elector talks to the in-cluster API
- refused: --leader-elect with a store that is not shared (memory, SQLite), a lease
  duration out of range, a lease name that is not a DNS-1123 label
- two replicas built by the command: exactly one serves Acquire; the other answers
  UNIMPLEMENTED for it and NOT_SERVING in health
- `serve()` with election: stopping the leader hands the Lease over, the other replica
  serves at once (well before the lease would expire)
"""

from __future__ import annotations

import argparse
import asyncio

import grpc
import kmock
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlslice.adapters.channel import open_channel
from rlslice.apps import scheduler as _cmd
from rlslice.config import GroupSpec
from rlslice.testing import free_port
from rlslice.v1alpha1 import scheduler_pb2, scheduler_pb2_grpc

from .conftest import NS, eventually


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    _cmd.configure(parser)
    return parser.parse_args(list(argv))


async def test_the_flags_build_an_elected_scheduler_on_the_in_cluster_api(
    cluster: kmock.KubernetesEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POD_NAME", "rlslice-scheduler-7d9f-abcde")
    args = parse("--leader-elect", "--store", "kubernetes", "--lease-name", "sched")
    election = _cmd.election_from(args)
    assert election == _cmd.Election(
        namespace=NS,
        name="sched",
        identity="rlslice-scheduler-7d9f-abcde",
        duration=15.0,
        retry_period=2.0,
    )
    elected = _cmd.elected_scheduler(_cmd.settings_from(args), election)
    assert elected.elector.api.server == str(cluster.url).rstrip("/")
    assert elected.elector.path.endswith(f"/namespaces/{NS}/leases/sched")
    assert not elected.leading
    await elected.elector.api.close()


def test_without_the_flag_there_is_no_election() -> None:
    assert _cmd.election_from(parse()) is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--leader-elect"], "needs --store kubernetes"),
        (["--leader-elect", "--store", "/var/lib/s.db"], "needs --store kubernetes"),
        (["--leader-elect", "--store", "kubernetes", "--lease-duration", "1"], "lease-duration"),
        (["--leader-elect", "--store", "kubernetes", "--lease-name", "Bad.Name"], "lease-name"),
    ],
    ids=["memory-store", "sqlite-store", "short-lease", "bad-lease-name"],
)
def test_an_election_that_cannot_work_is_refused(
    argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLSLICE_NAMESPACE", NS)
    with pytest.raises(SystemExit, match=message):
        _cmd.election_from(parse(*argv))


def test_the_environment_turns_election_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLSLICE_LEADER_ELECT", "true")
    monkeypatch.setenv("RLSLICE_STORE", "kubernetes")
    monkeypatch.setenv("RLSLICE_LEASE_NAME", "from-env")
    monkeypatch.setenv("RLSLICE_LEASE_NAMESPACE", "elsewhere")
    monkeypatch.setenv("RLSLICE_LEASE_DURATION", "6")
    monkeypatch.setenv("POD_NAME", "pod-a")
    election = _cmd.election_from(parse())
    assert election is not None
    assert (election.name, election.namespace, election.identity) == (
        "from-env",
        "elsewhere",
        "pod-a",
    )
    assert election.duration == 6.0
    assert election.retry_period == pytest.approx(0.8)


async def _acquire(address: str) -> int:
    """Register and acquire a job on `address`; the epoch granted."""
    async with open_channel(address) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        lease = await stub.Register(
            scheduler_pb2.RegisterRequest(job="a", group="g", lease_seconds=30), timeout=5
        )
        grant = await stub.Acquire(
            scheduler_pb2.AcquireRequest(
                job="a", group="g", lease_id=lease.lease_id, secret=lease.secret
            ),
            timeout=5,
        )
        return int(grant.epoch)


async def _health(address: str, service: str) -> int:
    async with open_channel(address) as channel:
        answer = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5
        )
        return int(answer.status)


async def test_two_replicas_built_by_the_command_serve_acquire_exactly_once(
    cluster: kmock.KubernetesEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    replicas = []
    for name in ("a", "b"):
        monkeypatch.setenv("POD_NAME", f"scheduler-{name}")
        args = parse(
            "--leader-elect",
            "--store",
            "kubernetes:cli",
            "--lease-duration",
            "3",
            "--address",
            "127.0.0.1:0",
            "--auto-create-groups",
        )
        election = _cmd.election_from(args)
        assert election is not None
        replicas.append(_cmd.elected_scheduler(_cmd.settings_from(args), election))
    for replica in replicas:
        await replica.start()
    try:
        await eventually(lambda: any(r.leading for r in replicas), what="a leader")
        await asyncio.sleep(0.5)  # a second step each: still exactly one
        (leader,) = [r for r in replicas if r.leading]
        (standby,) = [r for r in replicas if not r.leading]
        assert await _acquire(leader.address) >= 1
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _acquire(standby.address)
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert (
            await _health(standby.address, "rlslice.v1alpha1.Scheduler")
            == health_pb2.HealthCheckResponse.NOT_SERVING
        )
        lease = cluster.objects["coordination.k8s.io/v1/leases", NS, "rlslice-scheduler"]
        assert lease["spec"]["holderIdentity"] == leader.elector.identity
    finally:
        for replica in replicas:
            await replica.stop()


async def test_stopping_the_leaders_command_hands_over_at_once(
    cluster: kmock.KubernetesEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    ports = [free_port(), free_port()]
    stops = [asyncio.Event(), asyncio.Event()]
    tasks = []
    for index, port in enumerate(ports):
        args = parse(
            "--leader-elect",
            "--store",
            "kubernetes:handover",
            "--lease-duration",
            "30",  # a takeover by expiry would take far longer than this test waits
            "--lease-identity",
            f"replica-{index}",
            "--address",
            f"127.0.0.1:{port}",
        )
        settings = _cmd.settings_from(args).model_copy(update={"groups": (GroupSpec(name="g"),)})
        election = _cmd.election_from(args)
        tasks.append(asyncio.ensure_future(_cmd.serve(settings, election, stops[index])))
    addresses = [f"127.0.0.1:{port}" for port in ports]
    serving = health_pb2.HealthCheckResponse.SERVING

    async def leader_index() -> int | None:
        for index, address in enumerate(addresses):
            try:
                if await _health(address, "rlslice.v1alpha1.Scheduler") == serving:
                    return index + 1  # truthy
            except grpc.aio.AioRpcError:
                pass
        return None

    try:
        first = await eventually(leader_index, what="a leader") - 1
        stops[first].set()
        await tasks[first]
        other = 1 - first
        started = asyncio.get_running_loop().time()

        async def other_serves() -> bool:
            try:
                return await _health(addresses[other], "rlslice.v1alpha1.Scheduler") == serving
            except grpc.aio.AioRpcError:  # a check cut while the replica takes over
                return False

        await eventually(other_serves, timeout=10, what="the other replica serving")
        assert asyncio.get_running_loop().time() - started < 10
        assert await _acquire(addresses[other]) >= 1
    finally:
        for stop in stops:
            stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
