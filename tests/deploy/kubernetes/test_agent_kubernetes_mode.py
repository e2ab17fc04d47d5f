"""The agent's Kubernetes mode against kmock, a fixture /proc tree and a fake NVML pid list,
with real job processes, a real agent and a real scheduler on loopback.

Pure parts:
- node names -> node ids (table; hypothesis: always a DNS-1123 label, deterministic,
  labels kept as they are, names that differ map apart)
- NODE_NAME missing: an error naming it
- watch events folded into the pod cache (added, modified, deleted, bookmark, no UID)
- discovered jobs -> adoptable processes: bad labels skipped, a pid that exited or was
  reused since the scan is not adopted, jobs with nothing alive left out
End to end:
- the agent registers under the mapped node name with its Node's labels (and --label ones);
  a group whose node selector matches takes the node in, one that does not, not
- a pod appears -> Status lists its job with the pids on the GPU (its CPU-only helper
  and a host process are not); Snapshot freezes the discovered process (verified like a
  registered one), Restore thaws it
- discovery replaces a socket registration of the same job
- the pod goes away -> the job leaves Status
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import kmock
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlslice._ids import is_valid_id
from rlslice._nodes import node_label
from rlslice.adapters.auth import local_agent_token
from rlslice.adapters.channel import open_channel
from rlslice.adapters.kube import KubeAPI
from rlslice.config import GroupSpec
from rlslice.scheduler import SchedulerSettings, start_scheduler
from rlslice.snapshot_agent import AgentSettings, SimSettings
from rlslice.snapshot_agent.discovery import DiscoveredJob, ProcessKey, start_ticks_of
from rlslice.snapshot_agent.kubernetes_mode import (
    KubernetesAgent,
    KubernetesSettings,
    apply_event,
    node_name_from_env,
    start_kubernetes_agent,
    to_adopt,
)
from rlslice.snapshot_agent.processes import ProcessRef, identify
from rlslice.v1alpha1 import agent_pb2, agent_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc

from .conftest import eventually

NODE = "gpu-1.rack-3.example.internal"
UID = "0f4c2a8e-1b2c-4d5e-8f90-a1b2c3d4e5f6"
OTHER_UID = "11111111-2222-3333-4444-555555555555"


# --- node names -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("gpu-1", "gpu-1"),
        ("node0", "node0"),
        ("ip-10-0-1-7.ec2.internal", "ip-10-0-1-7-ec2-internal-27992f17"),
        ("GPU_Node.A", "gpu-node-a-3cf8a44e"),
        ("...", "node-ab5df625"),
    ],
    ids=["label", "label-digits", "dotted", "upper-and-underscore", "nothing-readable"],
)
def test_kubernetes_node_names_become_readable_labels(name: str, expected: str) -> None:
    assert node_label(name) == expected


@given(st.from_regex(r"[a-zA-Z0-9._-]{1,253}", fullmatch=True))
def test_every_node_name_maps_to_a_stable_label(name: str) -> None:
    label = node_label(name)
    assert is_valid_id(label)
    assert node_label(name) == label
    if is_valid_id(name):
        assert label == name


@given(st.lists(st.from_regex(r"[a-z0-9]{1,8}(\.[a-z0-9]{1,8}){1,3}", fullmatch=True), unique=True))
def test_different_node_names_map_to_different_labels(names: list[str]) -> None:
    assert len({node_label(n) for n in names}) == len(names)


def test_a_missing_node_name_is_named_in_the_error() -> None:
    with pytest.raises(ValueError, match=r"^NODE_NAME: "):
        node_name_from_env({})
    assert node_name_from_env({"NODE_NAME": NODE}) == NODE


# --- the pod cache and adoption -------------------------------------------------------


def pod(uid: str, name: str, *, job: str | None = "trainer", group: str = "rl-a") -> dict[str, Any]:
    labels = {"rlslice.dev/group": group}
    if job:
        labels["rlslice.dev/job"] = job
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"uid": uid, "name": name, "namespace": "rl", "labels": labels},
        "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "x"}]},
        "status": {"phase": "Running"},
    }


def test_watch_events_fold_into_the_pod_cache() -> None:
    pods: dict[str, dict[str, Any]] = {}
    first = pod("u1", "a")
    assert apply_event(pods, {"type": "ADDED", "object": first})
    assert not apply_event(pods, {"type": "MODIFIED", "object": first})  # nothing new
    changed = {**first, "status": {"phase": "Succeeded"}}
    assert apply_event(pods, {"type": "MODIFIED", "object": changed})
    assert pods["u1"]["status"]["phase"] == "Succeeded"
    assert not apply_event(pods, {"type": "BOOKMARK", "object": {"metadata": {"uid": "u9"}}})
    assert not apply_event(pods, {"type": "ADDED", "object": {"metadata": {}}})
    assert apply_event(pods, {"type": "DELETED", "object": first})
    assert not apply_event(pods, {"type": "DELETED", "object": first})
    assert pods == {}


@pytest.fixture
def short_dir() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="rk-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


class ProcTree:
    """A fixture /proc: `cgroup` names a pod, `stat` is the real process's own."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir()

    def add(self, pid: int, uid: str | None) -> None:
        folder = self.root / str(pid)
        folder.mkdir(exist_ok=True)
        path = (
            f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
            f"{uid.replace('-', '_')}.slice/cri-containerd-{pid}.scope"
            if uid
            else "/system.slice/sshd.service"
        )
        (folder / "cgroup").write_text(f"0::{path}\n")
        (folder / "stat").write_text(Path(f"/proc/{pid}/stat").read_text())

    def remove(self, pid: int) -> None:
        shutil.rmtree(self.root / str(pid))


@pytest.fixture
async def sleepers() -> AsyncIterator[list[int]]:
    """Four real processes standing in for a pod's and the host's processes."""
    processes = [
        await asyncio.create_subprocess_exec("sleep", "120", stdin=asyncio.subprocess.DEVNULL)
        for _ in range(4)
    ]
    yield [p.pid for p in processes]
    for process in processes:
        try:
            process.kill()
        except ProcessLookupError:
            pass
        await process.wait()


def key_of(pid: int, proc: Path) -> ProcessKey:
    ticks = start_ticks_of((proc / str(pid) / "stat").read_text())
    assert ticks is not None
    return ProcessKey(pid, ticks)


def test_only_live_processes_with_the_scanned_start_time_are_adopted(
    short_dir: Path, sleepers: list[int]
) -> None:
    proc = ProcTree(short_dir / "proc")
    live, reused, gone, _ = sleepers
    for pid in (live, reused, gone):
        proc.add(pid, UID)
    stale = ProcessKey(reused, key_of(reused, proc.root).start_ticks - 1)  # pid reused since
    jobs = {
        "trainer": DiscoveredJob(
            "trainer",
            "rl-a",
            (),
            (live, reused, gone),
            (key_of(live, proc.root), stale, key_of(gone, proc.root)),
        ),
        "Bad_Job": DiscoveredJob("Bad_Job", "rl-a", (), (live,), (key_of(live, proc.root),)),
        "no-group": DiscoveredJob("no-group", "", (), (live,), (key_of(live, proc.root),)),
        "empty": DiscoveredJob("empty", "rl-a", (), (), ()),
    }
    alive = {live, reused}

    def verify(pid: int) -> ProcessRef | None:
        return identify(pid) if pid in alive else None

    warned: set[tuple[str, str]] = set()
    found = to_adopt(jobs, proc.root, verify=verify, warned=warned)
    assert found == {"trainer": ("rl-a", frozenset({identify(live)}))}
    assert warned == {("Bad_Job", "rl-a"), ("no-group", "")}


# --- end to end -----------------------------------------------------------------------


class Setup:
    def __init__(self, cluster: kmock.KubernetesEmulator, proc: ProcTree, gpu: list[int]) -> None:
        self.cluster = cluster
        self.proc = proc
        self.gpu = gpu
        self.scheduler: Any = None
        self.agent: KubernetesAgent | None = None


@pytest.fixture
def rescan_seconds() -> float:
    return 0.2


@pytest.fixture
async def setup(
    cluster: kmock.KubernetesEmulator, short_dir: Path, tmp_path: Path, rescan_seconds: float
) -> AsyncIterator[Setup]:
    cluster.objects["v1/nodes", None, NODE] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": NODE,
            "labels": {"rlslice.dev/pool": "rl", "kubernetes.io/hostname": NODE},
        },
    }
    here = Setup(cluster, ProcTree(short_dir / "proc"), [])
    here.scheduler = await start_scheduler(
        SchedulerSettings(
            address="127.0.0.1:0",
            groups=(
                GroupSpec(name="rl-a", backend="sim", node_selector={"rlslice.dev/pool": "rl"}),
                GroupSpec(name="batch", node_selector={"rlslice.dev/pool": "batch"}),
            ),
        )
    )
    settings = AgentSettings(
        node="placeholder",
        address="127.0.0.1:0",
        socket_path=short_dir / "agent.sock",
        state_dir=tmp_path / "state",
        host_reserve_bytes=0,
        sim=SimSettings(root=short_dir / "sim", capacity_bytes=64 << 20, rate_gbps=0.0),
        scheduler=here.scheduler.address,
        labels={"team": "rl"},
    )
    kube = KubernetesSettings(
        node_name=NODE, proc_root=here.proc.root, rescan_seconds=rescan_seconds
    )
    here.agent = await start_kubernetes_agent(
        settings, kube, api=KubeAPI(str(cluster.url)), gpu_pids=lambda: list(here.gpu)
    )
    try:
        yield here
    finally:
        await here.agent.stop(0)
        await here.scheduler.stop(0)


async def agent_status(address: str) -> agent_pb2.AgentStatus:
    async with open_channel(address, token=local_agent_token()) as channel:
        status: agent_pb2.AgentStatus = await agent_pb2_grpc.AgentStub(channel).Status(
            agent_pb2.AgentStatusRequest(), timeout=5
        )
        return status


def jobs_of(status: agent_pb2.AgentStatus) -> dict[str, tuple[str, list[int]]]:
    return {j.job: (j.group, sorted(j.pids)) for j in status.jobs}


def process_state(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("State:"):
            return line.split()[1]
    return "?"


async def test_the_agent_registers_under_its_nodes_label_with_the_nodes_labels(
    setup: Setup,
) -> None:
    assert setup.agent is not None
    node = setup.agent.agent.node
    assert node == node_label(NODE)
    assert node.startswith("gpu-1-rack-3-example-internal-")
    coordinator = setup.scheduler.coordinator
    record = await eventually(lambda: coordinator.agents.get(node), what="registration")
    assert record.labels == {"rlslice.dev/pool": "rl", "kubernetes.io/hostname": NODE, "team": "rl"}
    async with open_channel(setup.scheduler.address) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        rl = await stub.GetGroup(scheduler_pb2.GetGroupRequest(group="rl-a"), timeout=5)
        batch = await stub.GetGroup(scheduler_pb2.GetGroupRequest(group="batch"), timeout=5)
    assert list(rl.nodes) == [node]
    assert list(batch.nodes) == []


async def test_a_pod_that_appears_is_a_job_whose_processes_the_agent_moves(
    setup: Setup, sleepers: list[int]
) -> None:
    assert setup.agent is not None
    on_gpu, helper, host, _ = sleepers
    setup.proc.add(on_gpu, UID)
    setup.proc.add(helper, UID)  # the same pod, not on the GPU: not the job's
    setup.proc.add(host, None)  # on the GPU, in no pod: never a job's
    setup.gpu[:] = [on_gpu, host]
    address = setup.agent.agent.address
    assert jobs_of(await agent_status(address)) == {}

    await setup.cluster.post("/api/v1/namespaces/rl/pods", json=pod(UID, "trainer-0"))

    async def listed() -> dict[str, tuple[str, list[int]]]:
        return jobs_of(await agent_status(address))

    assert await eventually(listed, what="the job in Status") == {"trainer": ("rl-a", [on_gpu])}

    # Verified like a registered process: a snapshot (sim) really freezes it.
    async with open_channel(address, token=local_agent_token()) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        parked = await stub.Snapshot(
            agent_pb2.SnapshotRequest(job="trainer", group="rl-a", epoch=1, backend="sim"),
            timeout=10,
        )
        assert parked.state == agent_pb2.AGENT_JOB_STATE_PARKED
        assert process_state(on_gpu) == "T"
        assert process_state(helper) != "T"
        back = await stub.Restore(
            agent_pb2.RestoreRequest(job="trainer", group="rl-a", epoch=2, backend="sim"),
            timeout=10,
        )
        assert back.state == agent_pb2.AGENT_JOB_STATE_RUNNING
        assert process_state(on_gpu) != "T"

    await setup.cluster.delete("/api/v1/namespaces/rl/pods/trainer-0")
    await eventually(lambda: _gone(address), what="the job leaving Status")


async def _gone(address: str) -> bool:
    return "trainer" not in jobs_of(await agent_status(address))


async def test_discovery_replaces_a_socket_registration_of_the_same_job(
    setup: Setup, sleepers: list[int]
) -> None:
    assert setup.agent is not None
    discovered, registered, _, _ = sleepers
    engine = setup.agent.agent.engine
    ref = identify(registered)
    assert ref is not None
    engine.register(ref, "trainer", "rl-a")
    assert jobs_of(await agent_status(setup.agent.agent.address))["trainer"][1] == [registered]

    setup.proc.add(discovered, UID)
    setup.gpu[:] = [discovered]
    await setup.cluster.post("/api/v1/namespaces/rl/pods", json=pod(UID, "trainer-0"))

    async def pids() -> list[int] | None:
        found = jobs_of(await agent_status(setup.agent.agent.address)).get("trainer")  # type: ignore[union-attr]
        return found[1] if found and found[1] == [discovered] else None

    assert await eventually(pids, what="discovered pids replacing the registered one") == [
        discovered
    ]


@pytest.mark.parametrize("rescan_seconds", [600.0])  # no timer: only events and moves
async def test_a_process_that_starts_on_the_gpu_later_is_found_before_a_move(
    setup: Setup, sleepers: list[int]
) -> None:
    """No pod event marks a process taking a GPU; the rescan before a move sees it."""
    assert setup.agent is not None
    first, second, _, _ = sleepers
    setup.proc.add(first, UID)
    setup.gpu[:] = [first]
    await setup.cluster.post("/api/v1/namespaces/rl/pods", json=pod(UID, "trainer-0"))
    await eventually(
        lambda: setup.agent.agent.engine.table.entries.get("trainer"),  # type: ignore[union-attr]
        what="the job",
    )
    setup.proc.add(second, UID)
    setup.gpu.append(second)
    await asyncio.sleep(0.15)  # past the window in which a move reuses the last scan
    async with open_channel(setup.agent.agent.address, token=setup.agent.agent.token) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        await stub.Snapshot(
            agent_pb2.SnapshotRequest(job="trainer", group="rl-a", epoch=1, backend="sim"),
            timeout=10,
        )
        assert {process_state(first), process_state(second)} == {"T"}
        await stub.Restore(
            agent_pb2.RestoreRequest(job="trainer", group="rl-a", epoch=2, backend="sim"),
            timeout=10,
        )


async def test_the_command_runs_in_kubernetes_mode_and_stops_on_sigterm(
    cluster: kmock.KubernetesEmulator, short_dir: Path, tmp_path: Path
) -> None:
    import signal
    import sys

    cluster.objects["v1/nodes", None, NODE] = {
        "metadata": {"name": NODE, "labels": {"rlslice.dev/pool": "rl"}}
    }
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("RLSLICE_")},
        "PYTHONSAFEPATH": "1",
        "RLSLICE_KUBE_API": str(cluster.url),
        "NODE_NAME": NODE,
        "RLSLICE_AGENT_KUBERNETES": "true",
        "RLSLICE_AGENT_PROC_ROOT": str(short_dir),
        "RLSLICE_AGENT_ADDRESS": "127.0.0.1:0",
        "RLSLICE_AGENT_SOCKET": str(short_dir / "a.sock"),
        "RLSLICE_AGENT_STATE_DIR": str(tmp_path / "state"),
        "RLSLICE_AGENT_SIM_ROOT": str(short_dir / "sim"),
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "rlslice.apps",
        "agent",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        assert f"node {node_label(NODE)} (Kubernetes node {NODE})" in line, line
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    # It asked the API for its Node and for the pods on it.
    paths = {request.url.path for request in cluster}
    assert f"/api/v1/nodes/{NODE}" in paths
    assert "/api/v1/pods" in paths
