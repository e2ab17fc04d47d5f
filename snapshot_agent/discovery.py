"""Find a job's GPU processes on this node from Kubernetes pods (DaemonSet mode).

The chain: pods on this node with the `rlslice.dev/job` label -> their pod UIDs ->
processes whose `/proc/<pid>/cgroup` names one of those UIDs -> intersected with the
processes NVML reports on the GPUs. Every cgroup layout the kubelet makes is understood:
cgroup v1 and v2, systemd driver (`kubepods-burstable-pod<uid with underscores>.slice`)
and cgroupfs driver (`/kubepods/burstable/pod<uid>/...`).

A checkpointed process releases the GPU, so NVML no longer lists it; `ProcessDiscovery`
remembers what it found and keeps a process (by pid and start time, so a reused pid is
never mistaken for it) while it lives in the same pod, so restore still finds it.

A job belongs to one namespace. Job names are global at the scheduler, but pods of two
namespaces can carry the same `rlslice.dev/job` label (two tenants' Deployments named
`trainer`, or a pod labelling itself into another tenant's job). `bind_namespaces` binds
each job name, on this node, to one namespace: the one already bound while it still has
a live pod of the job here, else the namespace of the job's oldest pod (creation time,
then namespace name). Pods of any other namespace with that label are refused: they are
not the job's pods, so their processes are never adopted, frozen or thawed for it. The
binding lapses when the bound namespace has no live pod of the job on the node left; a
newer pod of another namespace can never take a job over while the owner runs.

Pure functions over text and plain dicts; the /proc reader takes its root as a parameter
(a fixture tree in tests, the host's /proc mounted read-only in the DaemonSet), and NVML
is an injected function returning pids. `list_node_pods` is the thin Kubernetes adapter.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

JOB_LABEL = "rlslice.dev/job"
GROUP_LABEL = "rlslice.dev/group"

# A pod UID inside a cgroup path: dashes (cgroupfs) or underscores (systemd slices),
# always right after "pod" at the start of a path component or after a slice prefix.
_POD_UID = re.compile(
    r"(?:^|[/-])pod"
    r"([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
    r"(?:\.slice)?(?=/|$)"
)


@dataclass(frozen=True)
class PodRef:
    """A pod of a job on this node."""

    uid: str
    name: str
    namespace: str
    job: str
    group: str
    created: str = ""
    """`metadata.creationTimestamp` (RFC 3339, UTC: orders as text); "" when unknown."""


@dataclass(frozen=True)
class RefusedPod:
    """A pod whose job label names a job bound to another namespace on this node."""

    pod: PodRef
    owner: str
    """The namespace the job is bound to."""

    @property
    def reason(self) -> str:
        """Why the pod is not part of the job, naming both namespaces."""
        return (
            f"pod {self.pod.namespace}/{self.pod.name}: rlslice.dev/job={self.pod.job!r} is "
            f"a job of namespace {self.owner!r} on this node; a pod of namespace "
            f"{self.pod.namespace!r} cannot join it (refused: its processes are not the job's)"
        )


@dataclass(frozen=True)
class ProcessKey:
    """A process told apart from a later one that reuses its pid."""

    pid: int
    start_ticks: int
    """Field 22 of /proc/<pid>/stat: start time in clock ticks after boot."""


@dataclass(frozen=True)
class DiscoveredJob:
    """A job's processes on this node."""

    job: str
    group: str
    pods: tuple[PodRef, ...]
    pids: tuple[int, ...]
    """GPU processes of the job (sorted), including checkpointed ones seen before."""
    keys: tuple[ProcessKey, ...] = ()
    """The same processes with their start times (sorted by pid)."""
    namespace: str = ""
    """The namespace the job is bound to on this node (every pod in `pods` is of it)."""


def job_pods(pods: Iterable[Mapping[str, Any]], node: str) -> dict[str, PodRef]:
    """Pod UID -> PodRef for the live pods on `node` that carry a job label."""
    found: dict[str, PodRef] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        spec = pod.get("spec") or {}
        phase = (pod.get("status") or {}).get("phase", "")
        job = labels.get(JOB_LABEL)
        uid = meta.get("uid")
        if not job or not uid or spec.get("nodeName") != node:
            continue
        if phase in ("Succeeded", "Failed"):
            continue
        found[str(uid)] = PodRef(
            uid=str(uid),
            name=str(meta.get("name", "")),
            namespace=str(meta.get("namespace", "")),
            job=str(job),
            group=str(labels.get(GROUP_LABEL, "")),
            created=str(meta.get("creationTimestamp") or ""),
        )
    return found


def bind_namespaces(
    pods: Mapping[str, PodRef], owners: Mapping[str, str] | None = None
) -> tuple[dict[str, PodRef], dict[str, str], list[RefusedPod]]:
    """Each job bound to one namespace: (the pods that are the jobs', job -> namespace,
    the refused pods of other namespaces).

    A job keeps the namespace in `owners` (the last binding) while a pod of the job in that
    namespace is still here; otherwise it is bound to the namespace of its oldest pod
    (creation time, then namespace, then pod name: the same answer whatever the order of
    the listing). Jobs with no pod left here lose their binding.
    """
    by_job: dict[str, list[PodRef]] = {}
    for pod in pods.values():
        by_job.setdefault(pod.job, []).append(pod)
    bound: dict[str, str] = {}
    for job, members in by_job.items():
        previous = (owners or {}).get(job)
        if previous is not None and any(p.namespace == previous for p in members):
            bound[job] = previous
        else:
            oldest = min(members, key=lambda p: (p.created or "~", p.namespace, p.name))
            bound[job] = oldest.namespace
    kept: dict[str, PodRef] = {}
    refused: list[RefusedPod] = []
    for uid, pod in pods.items():
        if pod.namespace == bound[pod.job]:
            kept[uid] = pod
        else:
            refused.append(RefusedPod(pod, bound[pod.job]))
    refused.sort(key=lambda r: (r.pod.job, r.pod.namespace, r.pod.name))
    return kept, bound, refused


def pod_uid_of(cgroup_text: str) -> str | None:
    """The pod UID named by a /proc/<pid>/cgroup file's contents, dashed, or None.

    None too when the lines name different pods (never the case for a real process).
    """
    uids: set[str] = set()
    for line in cgroup_text.splitlines():
        # "hierarchy-id:controllers:path"; the path may itself contain ':'.
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for match in _POD_UID.finditer(parts[2]):
            uids.add(match.group(1).replace("_", "-"))
    return uids.pop() if len(uids) == 1 else None


def start_ticks_of(stat_text: str) -> int | None:
    """Field 22 (starttime) of a /proc/<pid>/stat line; the command may contain spaces."""
    _, _, rest = stat_text.rpartition(")")
    fields = rest.split()
    # rest starts at field 3 (state); starttime is field 22.
    try:
        return int(fields[22 - 3])
    except (IndexError, ValueError):
        return None


def scan_proc(proc_root: Path) -> dict[ProcessKey, str]:
    """Every process under `proc_root` that lives in a pod -> its pod UID.

    Processes that vanish while being read, or that cannot be read, are skipped.
    """
    found: dict[ProcessKey, str] = {}
    try:
        entries = list(proc_root.iterdir())
    except OSError:
        return found
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            uid = pod_uid_of((entry / "cgroup").read_text())
            ticks = start_ticks_of((entry / "stat").read_text())
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if uid is not None and ticks is not None:
            found[ProcessKey(int(entry.name), ticks)] = uid
    return found


def match_jobs(
    pods: Mapping[str, PodRef],
    processes: Mapping[ProcessKey, str],
    gpu_pids: Iterable[int] | None,
    remembered: Mapping[str, frozenset[ProcessKey]] | None = None,
) -> dict[str, frozenset[ProcessKey]]:
    """Job -> its GPU processes: in one of the job's pods, and on a GPU now or remembered.

    A remembered process stays only while the same process (pid and start time) still
    lives in a pod of the same job. `gpu_pids` None means no device filter: every process
    of the job's pods counts (the `sim` backend, whose devices NVML does not see).
    """
    on_gpu = None if gpu_pids is None else set(gpu_pids)
    result: dict[str, set[ProcessKey]] = {}
    for key, uid in processes.items():
        pod = pods.get(uid)
        if pod is None:
            continue
        kept = key in (remembered or {}).get(pod.job, frozenset())
        if on_gpu is None or key.pid in on_gpu or kept:
            result.setdefault(pod.job, set()).add(key)
    return {job: frozenset(keys) for job, keys in result.items()}


@dataclass
class ProcessDiscovery:
    """Discovery with memory: call `refresh()` with the node's pods; read `jobs`."""

    node: str
    proc_root: Path = Path("/proc")
    gpu_pids: Callable[[], Iterable[int] | None] = field(default=lambda: ())
    """NVML's compute processes on every device (host pids: the agent runs with hostPID);
    a function returning None counts every process of a job's pods."""
    _remembered: dict[str, frozenset[ProcessKey]] = field(default_factory=dict)
    jobs: dict[str, DiscoveredJob] = field(default_factory=dict)
    owners: dict[str, str] = field(default_factory=dict)
    """Job -> the namespace it is bound to on this node (`bind_namespaces`)."""
    refused: list[RefusedPod] = field(default_factory=list)
    """The pods of the last refresh refused for carrying another namespace's job label."""

    def refresh(self, pods: Iterable[Mapping[str, Any]]) -> dict[str, DiscoveredJob]:
        """Rediscover from `pods` (the API's pod list); returns job -> DiscoveredJob."""
        by_uid, self.owners, self.refused = bind_namespaces(job_pods(pods, self.node), self.owners)
        processes = scan_proc(self.proc_root)
        self._remembered = match_jobs(by_uid, processes, self.gpu_pids(), self._remembered)
        jobs: dict[str, DiscoveredJob] = {}
        for job, keys in self._remembered.items():
            job_pods_here = tuple(
                sorted(
                    (p for p in by_uid.values() if p.job == job),
                    key=lambda p: (p.namespace, p.name),
                )
            )
            jobs[job] = DiscoveredJob(
                job=job,
                group=next((p.group for p in job_pods_here if p.group), ""),
                pods=job_pods_here,
                pids=tuple(sorted(key.pid for key in keys)),
                keys=tuple(sorted(keys, key=lambda k: k.pid)),
                namespace=self.owners.get(job, ""),
            )
        self.jobs = jobs
        return jobs

    def pids_of(self, job: str) -> tuple[int, ...]:
        """The job's processes as last discovered (empty when none)."""
        found = self.jobs.get(job)
        return found.pids if found else ()


# --- The Kubernetes adapter -------------------------------------------------------------

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def node_pods_url(api_server: str, node: str) -> str:
    """The list URL for the job-labelled pods scheduled on `node`."""
    query = urllib.parse.urlencode(
        {"fieldSelector": f"spec.nodeName={node}", "labelSelector": JOB_LABEL}
    )
    return f"{api_server.rstrip('/')}/api/v1/pods?{query}"


async def list_node_pods(
    node: str,
    *,
    api_server: str = "https://kubernetes.default.svc",
    service_account: Path = SERVICE_ACCOUNT,
    timeout: float = 10.0,
) -> list[dict[str, Any]]:
    """The job-labelled pods on `node`, read with the pod's service account.

    Needs `list` on pods (the chart's agent ClusterRole grants it). Runs the request in a
    thread; the standard library is enough for one GET.
    """
    token_file = service_account / "token"
    ca_file = service_account / "ca.crt"

    def get() -> list[dict[str, Any]]:
        request = urllib.request.Request(node_pods_url(api_server, node))
        if token_file.exists():
            request.add_header("Authorization", f"Bearer {token_file.read_text().strip()}")
        context = ssl.create_default_context(cafile=str(ca_file) if ca_file.exists() else None)
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            body = json.load(response)
        return list(body.get("items") or [])

    return await asyncio.to_thread(get)
