"""The agent's Kubernetes mode (`rlslice agent --kubernetes`, the chart's DaemonSet).

- The node: its name from the downward API (`NODE_NAME`), made a DNS-1123 label by
  `rlslice._nodes.node_label` (a name with dots keeps its readable part plus a short
  hash); its labels read from the API (`nodes get`) and sent in RegisterAgent, so the
  scheduler can match TimeSliceGroup node selectors.
- The jobs: the pods on this node with the `rlslice.dev/job` label, kept current by a
  list-then-watch; their processes found by `discovery.ProcessDiscovery` (pod UID ->
  `/proc/<pid>/cgroup` -> pids, intersected with NVML's GPU processes, or every process
  of the pod for the `sim` backend). Found processes are handed to the engine as verified
  (`AgentEngine.adopt`), replacing socket registrations for those jobs.
- Whose: a job belongs to one namespace (`discovery.bind_namespaces`). A pod of another
  namespace carrying the same job label is refused: never adopted, so a switch of the job
  never freezes it; each refusal is logged once with both namespaces and listed in
  `KubernetesDiscovery.refused`.
- When: at every pod event, before every Snapshot/Restore (the discovery is the engine's
  `ProcessSource`, handed to it when the agent starts), and
  every `rescan_seconds`. The interval is needed: a container starting to use a GPU makes
  no API event, so only a fresh look at /proc and NVML sees it.

`start_kubernetes_agent(settings, kube)` starts an agent with all of this; tests hand in a
fixture /proc tree and a fake NVML pid list.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlslice._ids import is_valid_id
from rlslice._nodes import node_label
from rlslice.adapters.kube import KubeAPI, KubeError
from rlslice.snapshot_agent.agent import RunningAgent, start_agent
from rlslice.snapshot_agent.discovery import (
    JOB_LABEL,
    DiscoveredJob,
    ProcessDiscovery,
    RefusedPod,
    start_ticks_of,
)
from rlslice.snapshot_agent.engine import AgentEngine
from rlslice.snapshot_agent.processes import ProcessRef, identify
from rlslice.snapshot_agent.settings import AgentSettings

log = logging.getLogger(__name__)

PODS_PATH = "/api/v1/pods"
Found = dict[str, tuple[str, frozenset[ProcessRef]]]


@dataclass(frozen=True)
class KubernetesSettings:
    """Where the agent runs in the cluster and how it watches its node."""

    node_name: str
    """The Kubernetes node name as it is (dots allowed): `spec.nodeName` of the pod."""
    proc_root: Path = Path("/proc")
    """The host's /proc (the chart mounts it read-only at /host/proc; the agent has hostPID)."""
    rescan_seconds: float = 5.0
    """Seconds between looks at /proc and NVML when no pod event came."""
    watch_timeout_seconds: int = 300
    """The API server ends each pod watch after this; the agent lists again and re-watches."""

    @property
    def node(self) -> str:
        """The node id the agent registers under."""
        return node_label(self.node_name)


def node_name_from_env(environ: Mapping[str, str] = os.environ) -> str:
    """`NODE_NAME` (the downward API's `spec.nodeName`); an error naming it when unset."""
    name = environ.get("NODE_NAME", "").strip()
    if not name:
        raise ValueError(
            "NODE_NAME: not set; --kubernetes needs the node name from the downward API "
            "(env NODE_NAME from fieldRef spec.nodeName)"
        )
    return name


async def node_labels(api: KubeAPI, node_name: str) -> dict[str, str]:
    """The labels of node `node_name` (RBAC: `nodes get`)."""
    node = await api.request("GET", f"/api/v1/nodes/{urllib.parse.quote(node_name)}")
    labels = (node.get("metadata") or {}).get("labels") or {}
    return {str(k): str(v) for k, v in labels.items()}


def pods_query(node_name: str) -> dict[str, str]:
    """The list/watch parameters for the job-labelled pods on `node_name`."""
    return {"fieldSelector": f"spec.nodeName={node_name}", "labelSelector": JOB_LABEL}


def apply_event(pods: dict[str, dict[str, Any]], event: Mapping[str, Any]) -> bool:
    """Fold one watch event into `pods` (UID -> pod); whether anything changed."""
    kind = event.get("type")
    pod = event.get("object") or {}
    uid = str((pod.get("metadata") or {}).get("uid") or "")
    if not uid or kind not in ("ADDED", "MODIFIED", "DELETED"):
        return False  # BOOKMARK, or a pod without a UID
    if kind == "DELETED":
        return pods.pop(uid, None) is not None
    before = pods.get(uid)
    pods[uid] = dict(pod)
    return before != pod


def to_adopt(
    jobs: Mapping[str, DiscoveredJob],
    proc_root: Path,
    *,
    verify: Callable[[int], ProcessRef | None] = identify,
    warned: set[tuple[str, str]] | None = None,
) -> Found:
    """Discovered jobs as the engine takes them: job -> (group, verified processes).

    Each pid is checked again against the start time discovery saw, so a process that
    exited and whose pid was reused since the scan is never adopted. Labels that are not
    DNS-1123 labels are skipped (logged once each); jobs with no live process are left out.
    """
    out: Found = {}
    for job, found in jobs.items():
        if not (is_valid_id(job) and is_valid_id(found.group)):
            if warned is not None and (job, found.group) not in warned:
                warned.add((job, found.group))
                log.warning(
                    "pods with rlslice.dev/job=%r rlslice.dev/group=%r: not DNS-1123 labels "
                    "(a missing group label?); ignored",
                    job,
                    found.group,
                )
            continue
        refs: set[ProcessRef] = set()
        for key in found.keys:
            ref = verify(key.pid)
            if ref is None:
                continue
            try:
                ticks = start_ticks_of((proc_root / str(key.pid) / "stat").read_text())
            except OSError:
                continue
            if ticks == key.start_ticks:
                refs.add(ref)
        if refs:
            out[job] = (found.group, frozenset(refs))
    return out


class NvmlPids:
    """Host pids of the compute processes on every GPU, through `pynvml` (or a fake)."""

    def __init__(self, module: Any = None) -> None:
        self._module = module
        self._ready = False
        self._failed: str | None = None

    def __call__(self) -> list[int]:
        try:
            nvml = self._init()
            pids: list[int] = []
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                pids += [int(p.pid) for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)]
        except Exception as error:  # no driver, no library: nothing is on a GPU we can see
            reason = f"{type(error).__name__}: {error}"
            if reason != self._failed:
                log.error("NVML: cannot list GPU processes (%s); no job is discovered", reason)
                self._failed = reason
            return []
        self._failed = None
        return pids

    def _init(self) -> Any:
        if self._module is None:
            import pynvml

            self._module = pynvml
        if not self._ready:
            self._module.nvmlInit()
            self._ready = True
        return self._module


def gpu_pid_source(backend: str) -> Callable[[], Iterable[int] | None]:
    """What counts as a GPU process for the node's default `backend`: NVML's list, or (for
    `sim`, whose emulated devices NVML does not see) every process of a job's pods."""
    if backend == "sim":
        return lambda: None
    return NvmlPids()


@dataclass
class KubernetesDiscovery:
    """Keeps the engine's jobs equal to what the pods on this node run.

    Made before the agent (the engine takes it as its `ProcessSource`), it follows the
    pods once `start` hands it the engine; until then, and after `stop`, `rediscover`
    does nothing."""

    api: KubeAPI
    settings: KubernetesSettings
    gpu_pids: Callable[[], Iterable[int] | None]
    engine: AgentEngine | None = None
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    _discovery: ProcessDiscovery = field(init=False)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _last_scan: float = -1e9
    _warned: set[tuple[str, str]] = field(default_factory=set)
    _refusals_logged: set[tuple[str, str]] = field(default_factory=set)
    _resource_version: str = ""
    _following: bool = False

    def __post_init__(self) -> None:
        self._discovery = ProcessDiscovery(
            node=self.settings.node_name,
            proc_root=self.settings.proc_root,
            gpu_pids=self.gpu_pids,
        )

    async def start(self, engine: AgentEngine) -> None:
        """List the pods, adopt into `engine` what runs now, then follow pod events and
        rescan.

        An API that does not answer yet is not fatal: the watch keeps trying."""
        self.engine = engine
        try:
            await self._list()
        except KubeError as error:
            log.error("listing pods on %s: %s; retrying", self.settings.node_name, error)
        await self.refresh()
        self._following = True
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._follow(), name="kubernetes-pods"),
            loop.create_task(self._rescan(), name="kubernetes-rescan"),
        ]

    async def stop(self) -> None:
        """Stop following; the engine keeps the processes it has."""
        self._following = False
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    async def refresh(self) -> Found:
        """Look at /proc and NVML now and hand the result to the engine."""
        async with self._lock:
            self._changed.clear()
            started = asyncio.get_running_loop().time()
            pods = list(self.pods.values())
            found = await asyncio.to_thread(self._scan, pods)
            if self.engine is not None:
                self.engine.adopt(found)
            self._last_scan = started
            return found

    @property
    def refused(self) -> list[RefusedPod]:
        """The pods on this node refused at the last scan: their job label names a job
        bound to another namespace (each with a reason naming both namespaces)."""
        return list(self._discovery.refused)

    def _scan(self, pods: list[dict[str, Any]]) -> Found:
        jobs = self._discovery.refresh(pods)
        self._log_refusals(self._discovery.refused)
        return to_adopt(jobs, self.settings.proc_root, warned=self._warned)

    def _log_refusals(self, refused: list[RefusedPod]) -> None:
        current = {(r.pod.uid, r.owner) for r in refused}
        for refusal in refused:
            if (refusal.pod.uid, refusal.owner) not in self._refusals_logged:
                log.warning("%s", refusal.reason)
        self._refusals_logged = current  # a refusal that ends and comes back is logged again

    async def rediscover(self) -> None:
        """Scan again before a move, unless a scan just ran and no pod changed since (two
        moves on one node in one switch need not scan twice)."""
        if not self._following:
            return
        if self._changed.is_set() or asyncio.get_running_loop().time() - self._last_scan > 0.1:
            await self.refresh()

    async def _list(self) -> None:
        query = urllib.parse.urlencode(pods_query(self.settings.node_name))
        listing = await self.api.request("GET", f"{PODS_PATH}?{query}")
        self.pods = {
            str(pod["metadata"]["uid"]): pod
            for pod in listing.get("items") or []
            if (pod.get("metadata") or {}).get("uid")
        }
        self._resource_version = str((listing.get("metadata") or {}).get("resourceVersion", ""))
        self._changed.set()

    async def _follow(self) -> None:
        backoff = 0.5
        while True:
            try:
                async for event in self.api.watch(
                    PODS_PATH,
                    pods_query(self.settings.node_name),
                    resource_version=self._resource_version,
                    timeout_seconds=self.settings.watch_timeout_seconds,
                ):
                    meta = (event.get("object") or {}).get("metadata") or {}
                    self._resource_version = str(
                        meta.get("resourceVersion") or self._resource_version
                    )
                    if apply_event(self.pods, event):
                        self._changed.set()
                backoff = 0.5
            except KubeError as error:
                if error.status != 410:  # 410: our resource version is too old; relist
                    log.warning("watching pods on %s: %s", self.settings.node_name, error)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 30.0)
            # The watch ended (timeout, error, 410): list again, then watch from there.
            try:
                await self._list()
            except KubeError as error:
                log.warning("listing pods on %s: %s", self.settings.node_name, error)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    async def _rescan(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), self.settings.rescan_seconds)
            try:
                await self.refresh()
            except Exception:  # one bad scan must not end discovery
                log.exception("process discovery failed; retrying")
                await asyncio.sleep(self.settings.rescan_seconds)


@dataclass
class KubernetesAgent:
    """A running agent in Kubernetes mode: `agent` serves, `discovery` follows the pods."""

    agent: RunningAgent
    discovery: KubernetesDiscovery
    labels: dict[str, str]
    """The node's labels as read from the API (sent to the scheduler with --label ones)."""

    async def stop(self, grace: float | None = 1.0) -> None:
        """Stop following pods, then stop the agent."""
        await self.discovery.stop()
        await self.agent.stop(grace)
        await self.discovery.api.close()


async def start_kubernetes_agent(
    settings: AgentSettings,
    kube: KubernetesSettings,
    *,
    api: KubeAPI | None = None,
    gpu_pids: Callable[[], Iterable[int] | None] | None = None,
) -> KubernetesAgent:
    """Read the node's labels, start the agent under the node's label, follow its pods.

    `settings.node` is replaced by `kube.node`; labels given in `settings.labels` win over
    the node's own. A node whose labels cannot be read still gets an agent (jobs run; group
    node selectors just do not match it), with an error in the log.
    """
    api = api or KubeAPI.from_environment()
    try:
        labels = await node_labels(api, kube.node_name)
    except KubeError as error:
        log.error(
            "node %s: cannot read its labels (%s); registering without", kube.node_name, error
        )
        labels = {}
    settings = settings.model_copy(
        update={"node": kube.node, "labels": {**labels, **settings.labels}}
    )
    discovery = KubernetesDiscovery(api, kube, gpu_pids or gpu_pid_source(settings.backend))
    agent = await start_agent(settings, processes=discovery)
    try:
        await discovery.start(agent.engine)
    except BaseException:
        await discovery.stop()
        await agent.stop(0)
        await api.close()
        raise
    return KubernetesAgent(agent, discovery, labels)
