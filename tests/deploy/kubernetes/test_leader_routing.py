"""Traffic reaches only the leader; every healthy replica is Ready and scraped (kmock).

Case matrix (two ElectedScheduler replicas, each labelling its own pod):
- both running -> the leader's pod has `rlslice.dev/leader=true`, the standby's `false`;
  both say SERVING overall (the chart's readiness probe) and both serve /metrics with
  `rlslice_scheduler_leader` 1 and 0;
- the leader crashes (no release) -> the other replica's pod turns `true`;
- the crashed replica restarts in the same pod -> it clears its stale `true` at once;
- the new leader stops cleanly -> its pod turns `false`.
"""

from __future__ import annotations

import aiohttp
import kmock
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlslice.adapters.channel import open_channel
from rlslice.adapters.kube import KubeAPI
from rlslice.scheduler import SchedulerSettings
from rlslice.scheduler.leader import LEADER_LABEL, ElectedScheduler, LeaseElector

from .conftest import NS, eventually


def _replica(cluster: kmock.KubernetesEmulator, pod: str) -> ElectedScheduler:
    settings = SchedulerSettings(address="127.0.0.1:0", store="kubernetes:route", metrics_port=0)
    elector = LeaseElector(
        KubeAPI(str(cluster.url)), NS, "route", pod, duration=1.0, retry_period=0.1
    )
    return ElectedScheduler(settings, elector, pod=pod)


def _label(cluster: kmock.KubernetesEmulator, pod: str) -> str | None:
    labels = cluster.objects["v1/pods", NS, pod]["metadata"].get("labels") or {}
    return labels.get(LEADER_LABEL)


async def _leader_gauge(port: int | None) -> str:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        text = await response.text()
    return next(
        line.split()[1]
        for line in text.splitlines()
        if line.startswith("rlslice_scheduler_leader ")
    )


async def _overall_health(address: str) -> int:
    async with open_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        answer = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        return int(answer.status)


async def test_the_leader_label_follows_the_lease_through_a_failover(
    cluster: kmock.KubernetesEmulator,
) -> None:
    for pod in ("pod-a", "pod-b"):
        cluster.objects["v1/pods", NS, pod] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod, "namespace": NS, "labels": {"app": "s"}},
        }
    replicas = {pod: _replica(cluster, pod) for pod in ("pod-a", "pod-b")}
    restarted: ElectedScheduler | None = None
    for replica in replicas.values():
        await replica.start()
    try:
        first = await eventually(
            lambda: next((p for p, r in replicas.items() if r.leading), None), what="a leader"
        )
        second = "pod-b" if first == "pod-a" else "pod-a"
        await eventually(
            lambda: _label(cluster, first) == "true" and _label(cluster, second) == "false",
            what="labels: leader true, standby false",
        )
        serving = health_pb2.HealthCheckResponse.SERVING
        for replica in replicas.values():
            assert await _overall_health(replica.address) == serving  # both Ready
        assert await _leader_gauge(replicas[first].metrics_port) == "1.0"
        assert await _leader_gauge(replicas[second].metrics_port) == "0.0"

        await replicas[first].stop(release=False)  # a crash: nobody clears its label
        await eventually(lambda: _label(cluster, second) == "true", timeout=5, what="failover")
        assert replicas[second].leading

        restarted = _replica(cluster, first)  # the crashed container restarts in its pod
        await restarted.start()
        assert _label(cluster, first) == "false"
        assert not restarted.leading

        await replicas[second].stop(release=True)
        assert _label(cluster, second) == "false"
        await eventually(lambda: _label(cluster, first) == "true", timeout=5, what="handover")
    finally:
        for replica in [*replicas.values(), restarted]:
            if replica is not None:
                await replica.stop()
