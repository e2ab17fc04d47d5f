"""A job belongs to one namespace at the agent: pods of another namespace carrying the same
`rlslice.dev/job` label are refused, never adopted, never frozen for the job.

Pure (`bind_namespaces`):
- the oldest pod's namespace owns the job, whatever the listing order
- the owner keeps the job while it has a pod here, even against an older pod of another
  namespace appearing later; the binding lapses when the owner's pods are gone
End to end (kmock, a fixture /proc, a real agent and scheduler):
- two namespaces' pods with the same job label: only the owning namespace's process is
  the job's; a switch of the job freezes it and never the other namespace's process
- a pod labelling itself into another namespace's running job is refused, logged with
  both namespaces and listed as refused
"""

# ruff: noqa: F811  (the fixtures are imported from the kubernetes_mode tests)

from __future__ import annotations

import logging
from typing import Any

import pytest

from rlslice.adapters.channel import open_channel
from rlslice.snapshot_agent.discovery import PodRef, bind_namespaces
from rlslice.v1alpha1 import agent_pb2, agent_pb2_grpc

from .conftest import eventually
from .test_agent_kubernetes_mode import (  # noqa: F401  (fixtures)
    NODE,
    Setup,
    agent_status,
    jobs_of,
    process_state,
    rescan_seconds,
    setup,
    short_dir,
    sleepers,
)

OWNER_UID = "aaaaaaaa-1111-4222-8333-444444444444"
OTHER_UID = "bbbbbbbb-1111-4222-8333-444444444444"


def ref(uid: str, namespace: str, created: str, *, job: str = "trainer") -> PodRef:
    return PodRef(uid, f"{namespace}-pod", namespace, job, "rl-a", created)


def test_the_oldest_pods_namespace_owns_the_job_whatever_the_order() -> None:
    older = ref("u1", "rl", "2026-01-01T00:00:00Z")
    newer = ref("u2", "web", "2026-01-02T00:00:00Z")
    for pods in ({"u1": older, "u2": newer}, {"u2": newer, "u1": older}):
        kept, owners, refused = bind_namespaces(pods)
        assert kept == {"u1": older}
        assert owners == {"trainer": "rl"}
        assert [(r.pod.uid, r.owner) for r in refused] == [("u2", "rl")]
        assert "'rl'" in refused[0].reason
        assert "'web'" in refused[0].reason


def test_the_owner_keeps_its_job_until_its_pods_are_gone_here() -> None:
    mine = ref("u1", "rl", "2026-01-02T00:00:00Z")
    _, owners, _ = bind_namespaces({"u1": mine})
    older_other = ref("u2", "web", "2026-01-01T00:00:00Z")
    kept, owners, refused = bind_namespaces({"u1": mine, "u2": older_other}, owners)
    assert kept == {"u1": mine}
    assert owners == {"trainer": "rl"}
    assert [r.pod.uid for r in refused] == ["u2"]
    # The owner's pod left this node: the job name is free again.
    kept, owners, refused = bind_namespaces({"u2": older_other}, owners)
    assert kept == {"u2": older_other}
    assert owners == {"trainer": "web"}
    assert refused == []
    _, owners, _ = bind_namespaces({}, owners)
    assert owners == {}


def pod_in(namespace: str, uid: str, created: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "uid": uid,
            "name": "trainer-0",
            "namespace": namespace,
            "creationTimestamp": created,
            "labels": {"rlslice.dev/group": "rl-a", "rlslice.dev/job": "trainer"},
        },
        "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "x"}]},
        "status": {"phase": "Running"},
    }


async def switch_freezes_only(setup: Setup, frozen: int, untouched: int) -> None:
    assert setup.agent is not None
    async with open_channel(setup.agent.agent.address, token=setup.agent.agent.token) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        parked = await stub.Snapshot(
            agent_pb2.SnapshotRequest(job="trainer", group="rl-a", epoch=1, backend="sim"),
            timeout=10,
        )
        assert parked.state == agent_pb2.AGENT_JOB_STATE_PARKED
        assert process_state(frozen) == "T"
        assert process_state(untouched) != "T"
        back = await stub.Restore(
            agent_pb2.RestoreRequest(job="trainer", group="rl-a", epoch=2, backend="sim"),
            timeout=10,
        )
        assert back.state == agent_pb2.AGENT_JOB_STATE_RUNNING
        assert process_state(frozen) != "T"


async def test_two_namespaces_pods_with_one_job_label_are_one_namespaces_job(
    setup: Setup, sleepers: list[int]
) -> None:
    assert setup.agent is not None
    mine, theirs, _, _ = sleepers
    setup.proc.add(mine, OWNER_UID)
    setup.proc.add(theirs, OTHER_UID)
    setup.gpu[:] = [mine, theirs]
    await setup.cluster.post(
        "/api/v1/namespaces/rl/pods", json=pod_in("rl", OWNER_UID, "2026-01-01T00:00:00Z")
    )
    await setup.cluster.post(
        "/api/v1/namespaces/web/pods", json=pod_in("web", OTHER_UID, "2026-01-02T00:00:00Z")
    )
    address = setup.agent.agent.address

    async def both_seen() -> bool:
        return bool(setup.agent and setup.agent.discovery.refused)

    await eventually(both_seen, what="the other namespace's pod refused")
    assert jobs_of(await agent_status(address)) == {"trainer": ("rl-a", [mine])}
    [refusal] = setup.agent.discovery.refused
    assert (refusal.pod.namespace, refusal.owner) == ("web", "rl")
    await switch_freezes_only(setup, frozen=mine, untouched=theirs)


async def test_a_pod_labelling_itself_into_another_namespaces_job_is_refused(
    setup: Setup, sleepers: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    assert setup.agent is not None
    mine, intruder, _, _ = sleepers
    setup.proc.add(mine, OWNER_UID)
    setup.gpu[:] = [mine]
    await setup.cluster.post(
        "/api/v1/namespaces/rl/pods", json=pod_in("rl", OWNER_UID, "2026-01-02T00:00:00Z")
    )
    address = setup.agent.agent.address

    async def listed() -> dict[str, tuple[str, list[int]]]:
        return jobs_of(await agent_status(address))

    assert await eventually(listed, what="the owner's job") == {"trainer": ("rl-a", [mine])}

    # Another tenant labels its pod into the job, even claiming an older creation time.
    caplog.set_level(logging.WARNING, logger="rlslice.snapshot_agent.kubernetes_mode")
    setup.proc.add(intruder, OTHER_UID)
    setup.gpu.append(intruder)
    await setup.cluster.post(
        "/api/v1/namespaces/web/pods", json=pod_in("web", OTHER_UID, "2025-01-01T00:00:00Z")
    )
    await eventually(lambda: setup.agent and setup.agent.discovery.refused, what="refusal")
    assert jobs_of(await agent_status(address)) == {"trainer": ("rl-a", [mine])}
    logged = [r.getMessage() for r in caplog.records if "cannot join" in r.getMessage()]
    assert len(logged) == 1
    assert "web/trainer-0" in logged[0]
    assert "namespace 'rl'" in logged[0]
    assert "namespace 'web'" in logged[0]
    await switch_freezes_only(setup, frozen=mine, untouched=intruder)
