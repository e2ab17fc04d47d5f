"""Process discovery from pods, /proc and NVML (the agent's DaemonSet mode).

cgroup layouts (table): v2 systemd burstable / besteffort / guaranteed; v1 systemd with
many controllers; v1 and v2 cgroupfs; kind's nested kubelet; a host process; two pods
named at once (refused). Discovery over a fixture /proc tree and a fake NVML list:
- only pods on this node with a job label count; finished pods do not
- a pod's processes on the GPU are the job's; its CPU-only helpers are not
- a checkpointed process that left NVML's list stays (restore finds it)
- that process exiting, or its pid being reused by another process, drops it
- vanished or unreadable /proc entries are skipped
- the adapter lists the node's job pods with the service-account token (kmock)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kmock
import pytest

from rlslice.snapshot_agent.discovery import (
    ProcessDiscovery,
    job_pods,
    list_node_pods,
    pod_uid_of,
    start_ticks_of,
)

UID = "0f4c2a8e-1b2c-4d5e-8f90-a1b2c3d4e5f6"
UNDERSCORED = UID.replace("-", "_")
OTHER = "11111111-2222-3333-4444-555555555555"


@pytest.mark.parametrize(
    "text",
    [
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UNDERSCORED}.slice/cri-containerd-abc.scope\n",
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UNDERSCORED}.slice/crio-abc.scope\n",
        f"0::/kubepods.slice/kubepods-pod{UNDERSCORED}.slice/cri-containerd-abc.scope\n",
        (
            f"12:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UNDERSCORED}.slice/docker-abc.scope\n"
            f"11:cpu,cpuacct:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UNDERSCORED}.slice/docker-abc.scope\n"
            "1:name=systemd:/system.slice/containerd.service\n"
        ),
        f"4:devices:/kubepods/burstable/pod{UID}/0123456789abcdef\n3:pids:/kubepods/burstable/pod{UID}/0123456789abcdef\n",
        f"0::/kubepods/pod{UID}/0123456789abcdef\n",
        f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod{UNDERSCORED}.slice/cri-containerd-1.scope\n",
        f"0::/kubelet/kubepods/besteffort/pod{UID}/abc\n",
    ],
    ids=[
        "v2-systemd-burstable",
        "v2-systemd-besteffort",
        "v2-systemd-guaranteed",
        "v1-systemd",
        "v1-cgroupfs",
        "v2-cgroupfs-guaranteed",
        "kind-systemd",
        "kind-cgroupfs",
    ],
)
def test_every_kubelet_cgroup_layout_names_the_pod(text: str) -> None:
    assert pod_uid_of(text) == UID


@pytest.mark.parametrize(
    "text",
    [
        "0::/system.slice/sshd.service\n",
        "0::/user.slice/user-1000.slice/session-2.scope\n",
        "",
        "garbage\n",
        f"0::/kubepods/burstable/pod{UID}/a\n1:cpu:/kubepods/burstable/pod{OTHER}/b\n",
        f"0::/srv/mypod{UID}/x\n",
    ],
    ids=["host-service", "user-session", "empty", "garbage", "two-pods", "pod-inside-a-word"],
)
def test_a_process_outside_exactly_one_pod_names_none(text: str) -> None:
    assert pod_uid_of(text) is None


def test_the_start_time_is_read_even_when_the_command_has_spaces_and_parens() -> None:
    line = "4242 (python (rollout) x) S " + " ".join(str(n) for n in range(4, 22)) + " 987654 0 0\n"
    assert start_ticks_of(line) == 987654
    assert start_ticks_of("1 (x) S 1 2") is None


def pod(
    uid: str, name: str, *, node: str = "gpu-1", job: str | None = "trainer", phase: str = "Running"
) -> dict[str, Any]:
    labels = {"rlslice.dev/group": "rl-a"}
    if job:
        labels["rlslice.dev/job"] = job
    return {
        "metadata": {"uid": uid, "name": name, "namespace": "rl", "labels": labels},
        "spec": {"nodeName": node},
        "status": {"phase": phase},
    }


def test_only_live_job_pods_on_this_node_count() -> None:
    pods = [
        pod("u1", "a"),
        pod("u2", "b", node="gpu-2"),
        pod("u3", "c", job=None),
        pod("u4", "d", phase="Succeeded"),
        pod("u5", "e", phase="Pending"),
    ]
    assert set(job_pods(pods, "gpu-1")) == {"u1", "u5"}


class ProcTree:
    """A fixture /proc: numbered directories with `cgroup` and `stat` files."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir()
        (root / "self").mkdir()
        (root / "meminfo").write_text("MemTotal: 1 kB\n")

    def add(self, pid: int, uid: str | None, *, start: int = 100) -> None:
        folder = self.root / str(pid)
        folder.mkdir(exist_ok=True)
        path = (
            f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid.replace('-', '_')}.slice/cri-containerd-{pid}.scope"
            if uid
            else "/system.slice/sshd.service"
        )
        (folder / "cgroup").write_text(f"0::{path}\n")
        rest = " ".join(["S"] + ["0"] * 18 + [str(start)] + ["0", "0"])
        (folder / "stat").write_text(f"{pid} (python) {rest}\n")

    def remove(self, pid: int) -> None:
        for file in (self.root / str(pid)).iterdir():
            file.unlink()
        (self.root / str(pid)).rmdir()


@pytest.fixture
def proc(tmp_path: Path) -> ProcTree:
    return ProcTree(tmp_path / "proc")


def test_a_jobs_gpu_processes_are_those_of_its_pods_on_the_gpu(proc: ProcTree) -> None:
    proc.add(10, UID)  # trainer, on the GPU
    proc.add(11, UID)  # trainer's data loader, CPU only
    proc.add(20, OTHER)  # sampler, on the GPU
    proc.add(30, None)  # a host process on the GPU (not a pod: never ours)
    gpu = [10, 20, 30]
    discovery = ProcessDiscovery(node="gpu-1", proc_root=proc.root, gpu_pids=lambda: gpu)
    jobs = discovery.refresh([pod(UID, "trainer-0"), pod(OTHER, "sampler-0", job="sampler")])
    assert {job: found.pids for job, found in jobs.items()} == {"trainer": (10,), "sampler": (20,)}
    assert jobs["trainer"].group == "rl-a"
    assert [p.name for p in jobs["trainer"].pods] == ["trainer-0"]


def test_a_checkpointed_process_is_remembered_until_it_exits(proc: ProcTree) -> None:
    proc.add(10, UID)
    gpu = [10]
    discovery = ProcessDiscovery(node="gpu-1", proc_root=proc.root, gpu_pids=lambda: gpu)
    pods = [pod(UID, "trainer-0")]
    assert discovery.refresh(pods)["trainer"].pids == (10,)

    gpu.clear()  # checkpointed: NVML no longer lists it
    assert discovery.refresh(pods)["trainer"].pids == (10,)
    assert discovery.pids_of("trainer") == (10,)

    proc.remove(10)  # it exits
    assert "trainer" not in discovery.refresh(pods)
    assert discovery.pids_of("trainer") == ()


def test_a_reused_pid_is_not_mistaken_for_the_remembered_process(proc: ProcTree) -> None:
    proc.add(10, UID, start=100)
    gpu = [10]
    discovery = ProcessDiscovery(node="gpu-1", proc_root=proc.root, gpu_pids=lambda: gpu)
    pods = [pod(UID, "trainer-0")]
    discovery.refresh(pods)
    gpu.clear()
    proc.remove(10)
    proc.add(10, UID, start=555)  # a new process got pid 10, not on the GPU
    assert "trainer" not in discovery.refresh(pods)


def test_a_remembered_process_is_dropped_when_its_pod_is_gone(proc: ProcTree) -> None:
    proc.add(10, UID)
    gpu = [10]
    discovery = ProcessDiscovery(node="gpu-1", proc_root=proc.root, gpu_pids=lambda: gpu)
    discovery.refresh([pod(UID, "trainer-0")])
    gpu.clear()
    assert discovery.refresh([]) == {}


def test_unreadable_or_vanishing_entries_are_skipped(proc: ProcTree) -> None:
    proc.add(10, UID)
    (proc.root / "11").mkdir()  # vanished between listing and reading: no files
    proc.add(12, UID)
    (proc.root / "12" / "stat").write_text("garbage")
    discovery = ProcessDiscovery(node="gpu-1", proc_root=proc.root, gpu_pids=lambda: [10, 11, 12])
    assert discovery.refresh([pod(UID, "trainer-0")])["trainer"].pids == (10,)


def test_a_missing_proc_root_finds_nothing(tmp_path: Path) -> None:
    discovery = ProcessDiscovery(node="gpu-1", proc_root=tmp_path / "absent", gpu_pids=lambda: [1])
    assert discovery.refresh([pod(UID, "trainer-0")]) == {}


async def test_the_adapter_lists_the_nodes_job_pods_with_the_service_account(
    kmock: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    kmock.resources["v1/pods"] = kmock.ResourceInfo(kind="Pod", namespaced=True, verbs={"list"})
    kmock.objects["v1/pods", "rl", "trainer-0"] = pod(UID, "trainer-0")
    account = tmp_path / "sa"
    account.mkdir()
    (account / "token").write_text("sa-token\n")
    items = await list_node_pods("gpu-1", api_server=str(kmock.url), service_account=account)
    assert [item["metadata"]["uid"] for item in items] == [UID]
    (request,) = list(kmock)
    assert request.params["fieldSelector"] == "spec.nodeName=gpu-1"
    assert request.params["labelSelector"] == "rlslice.dev/job"
    assert request.headers["Authorization"] == "Bearer sa-token"
