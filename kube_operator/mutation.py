"""Pod mutation for the admission webhook: `mutate(pod, group, settings) -> JSON patch`. Pure.

A pod labelled `rlslice.dev/group` joins that TimeSliceGroup. It gets, without touching
anything the pod already sets:

- the `RLSLICE_*` environment the client reads (job, group, scheduler address, agent
  socket), and the job token from a Secret by `secretKeyRef` (never the token's value);
- a hostPath volume with the node agent's Unix socket, mounted in every container;
- the group's node selector (keys the pod already selects on are left alone) and a
  toleration for the GPU taint;
- the `rlslice.dev/job` label when the pod had none: the agent finds a job's processes
  on its node by that label. The job is derived from the pod's controller (a Deployment's
  ReplicaSet, a Job, a StatefulSet), else from the pod's (generate)name;
- for a job on the `sim` backend (the group's, or the job's own in the group's `jobs`):
  `RLSLICE_SIM_ROOT` (the agents' emulated device memory, a host folder) and
  `RLSLICE_NODE` (the node's name, from the downward API), which `rlslice.client.sim`
  reads to find this node's devices; the folder is mounted when the socket mount does not
  already carry it.

Pods in system namespaces and pods without the group label get an empty patch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from rlslice import env as names
from rlslice._errors import InvalidArgumentError
from rlslice._ids import MAX_ID_LENGTH, is_valid_id
from rlslice.operator.spec import node_labels

GROUP_LABEL = "rlslice.dev/group"
JOB_LABEL = "rlslice.dev/job"
VOLUME_NAME = "rlslice-agent"

#: Namespaces never mutated, whatever the webhook configuration says.
SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease"})


class InjectionSettings(BaseModel):
    """What the operator injects; set from `rlslice operator` flags (the chart sets them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scheduler_address: str
    """The scheduler's address as pods reach it (`host:port`)."""
    agent_socket_dir: str = "/run/rlslice"
    """Host directory holding the agent's socket; mounted at the same path in containers."""
    agent_socket_name: str = "agent.sock"
    """File name of the agent's socket in that directory."""
    token_secret: str | None = None
    """Secret (in the pod's namespace) holding the job token; None injects no token."""
    token_secret_key: str = "token"
    """Key of the token in that Secret."""
    tls_ca_secret: str | None = None
    """Secret (in the pod's namespace) with `ca.crt` to verify the scheduler; None: plaintext."""
    gpu_toleration_key: str | None = "nvidia.com/gpu"
    """Taint key GPU nodes carry; None adds no toleration."""
    skip_namespaces: frozenset[str] = SYSTEM_NAMESPACES
    """Namespaces whose pods are never mutated (the operator's own belongs here)."""
    sim_root: str | None = None
    """Host folder of the agents' `sim` backend (their `--sim-root`); None: `sim` inside
    `agent_socket_dir`, which the socket mount already carries."""

    @property
    def agent_socket(self) -> str:
        """Path of the agent's socket inside a container."""
        return f"{self.agent_socket_dir.rstrip('/')}/{self.agent_socket_name}"

    @property
    def sim_root_path(self) -> str:
        """The `sim` backend's host folder, as injected into pods."""
        return self.sim_root or f"{self.agent_socket_dir.rstrip('/')}/sim"

    @property
    def sim_root_mounted(self) -> bool:
        """Whether the socket directory's mount already carries the sim root."""
        base = self.agent_socket_dir.rstrip("/") + "/"
        return self.sim_root_path.startswith(base)


_TLS_VOLUME = "rlslice-tls-ca"
_TLS_MOUNT = "/etc/rlslice/scheduler-ca"
_SIM_VOLUME = "rlslice-sim"


def mutate(
    pod: Mapping[str, Any], group: Mapping[str, Any] | None, settings: InjectionSettings
) -> list[dict[str, Any]]:
    """JSON-patch operations (RFC 6902) that make `pod` a member of its TimeSliceGroup.

    `group` is the TimeSliceGroup resource the pod's label names, or None when it does not
    exist (yet): the pod still gets its environment, but no node selector.
    """
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    group_name = labels.get(GROUP_LABEL)
    if not group_name or meta.get("namespace") in settings.skip_namespaces:
        return []
    spec = pod.get("spec") or {}
    ops: list[dict[str, Any]] = []

    job = labels.get(JOB_LABEL) or job_name_for(pod)
    if not labels.get(JOB_LABEL):
        ops.append(_add(f"/metadata/labels/{_escape(JOB_LABEL)}", job))

    sim = uses_sim(group, job)
    env = _env(job, str(group_name), settings, sim=sim)
    mounts = _mounts(settings, sim=sim)
    for kind in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(kind) or ()):
            base = f"/spec/{kind}/{index}"
            ops += _append_missing(base, "env", container.get("env"), env, key="name")
            ops += _append_missing(
                base, "volumeMounts", container.get("volumeMounts"), mounts, key="name"
            )
    volumes = _volumes(settings, sim=sim)
    ops += _append_missing("/spec", "volumes", spec.get("volumes"), volumes, key="name")

    selector = _node_labels(((group or {}).get("spec") or {}).get("nodeSelector"))
    ops += _merge_map("/spec", "nodeSelector", spec.get("nodeSelector"), selector)
    if settings.gpu_toleration_key:
        toleration = {
            "key": settings.gpu_toleration_key,
            "operator": "Exists",
            "effect": "NoSchedule",
        }
        ops += _append_missing(
            "/spec", "tolerations", spec.get("tolerations"), [toleration], key="key"
        )
    return ops


def uses_sim(group: Mapping[str, Any] | None, job: str) -> bool:
    """Whether `job` moves its state with the `sim` backend in `group` (a TimeSliceGroup):
    the job's own backend in the group's `jobs` wins over the group's. Unknown group: no."""
    spec = (group or {}).get("spec") or {}
    for entry in spec.get("jobs") or ():
        if entry.get("name") == job and entry.get("backend"):
            return bool(entry["backend"] == "sim")
    return bool(spec.get("backend") == "sim")


def job_name_for(pod: Mapping[str, Any]) -> str:
    """The job id of a pod without a job label: its controller's name, else its own.

    A ReplicaSet's name loses the pod-template hash, so the pods of one Deployment form
    one job; the result is made a DNS-1123 label.

    The name is unique only within the pod's namespace: two namespaces' controllers of one
    name derive one job name. The agent binds a job to one namespace per node
    (`rlslice.snapshot_agent.discovery.bind_namespaces`) and refuses the other's pods, so
    a collision never lets one tenant's switch freeze the other's processes; pods of
    groups shared by several namespaces should set `rlslice.dev/job` themselves.
    """
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    owners = meta.get("ownerReferences") or ()
    owner = next((o for o in owners if o.get("controller")), owners[0] if owners else None)
    name = ""
    if owner is not None:
        name = str(owner.get("name") or "")
        template_hash = labels.get("pod-template-hash")
        if owner.get("kind") == "ReplicaSet" and template_hash:
            name = name.removesuffix(f"-{template_hash}")
    if not name:
        name = str(meta.get("name") or "") or str(meta.get("generateName") or "").rstrip("-")
    return _as_label(name)


def _as_label(text: str) -> str:
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower())[:MAX_ID_LENGTH].strip("-")
    return label if is_valid_id(label) else "job"


def _env(job: str, group: str, settings: InjectionSettings, *, sim: bool) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": names.JOB, "value": job},
        {"name": names.GROUP, "value": group},
        {"name": names.SCHEDULER, "value": settings.scheduler_address},
        {"name": names.AGENT_SOCKET, "value": settings.agent_socket},
    ]
    if settings.token_secret:
        ref = {"name": settings.token_secret, "key": settings.token_secret_key}
        env.append({"name": names.TOKEN, "valueFrom": {"secretKeyRef": ref}})
    if settings.tls_ca_secret:
        env.append({"name": names.TLS_CA, "value": f"{_TLS_MOUNT}/ca.crt"})
    if sim:
        env.append({"name": names.SIM_ROOT, "value": settings.sim_root_path})
        node = {"fieldRef": {"fieldPath": "spec.nodeName"}}
        env.append({"name": names.NODE, "valueFrom": node})
    return env


def _volumes(settings: InjectionSettings, *, sim: bool) -> list[dict[str, Any]]:
    # A directory, not the socket file: the agent recreates its socket when it restarts,
    # and a file mount would keep pointing at the old one.
    volumes: list[dict[str, Any]] = [
        {
            "name": VOLUME_NAME,
            "hostPath": {"path": settings.agent_socket_dir, "type": "DirectoryOrCreate"},
        }
    ]
    if settings.tls_ca_secret:
        volumes.append(
            {
                "name": _TLS_VOLUME,
                "secret": {
                    "secretName": settings.tls_ca_secret,
                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                },
            }
        )
    if sim and not settings.sim_root_mounted:
        volumes.append(
            {
                "name": _SIM_VOLUME,
                "hostPath": {"path": settings.sim_root_path, "type": "DirectoryOrCreate"},
            }
        )
    return volumes


def _mounts(settings: InjectionSettings, *, sim: bool) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = [
        {"name": VOLUME_NAME, "mountPath": settings.agent_socket_dir.rstrip("/") or "/"}
    ]
    if settings.tls_ca_secret:
        mounts.append({"name": _TLS_VOLUME, "mountPath": _TLS_MOUNT, "readOnly": True})
    if sim and not settings.sim_root_mounted:
        mounts.append({"name": _SIM_VOLUME, "mountPath": settings.sim_root_path})
    return mounts


def _append_missing(
    base: str,
    name: str,
    current: Sequence[Mapping[str, Any]] | None,
    wanted: Sequence[Mapping[str, Any]],
    *,
    key: str,
) -> list[dict[str, Any]]:
    """Ops adding the `wanted` items whose `key` the list does not have yet."""
    present = {item.get(key) for item in current or ()}
    missing = [dict(item) for item in wanted if item.get(key) not in present]
    if not missing:
        return []
    if current is None:
        return [_add(f"{base}/{name}", missing)]
    return [_add(f"{base}/{name}/-", item) for item in missing]


def _merge_map(
    base: str, name: str, current: Mapping[str, str] | None, wanted: Mapping[str, str]
) -> list[dict[str, Any]]:
    """Ops adding the `wanted` keys the map does not have; existing keys keep their values."""
    missing = {k: v for k, v in wanted.items() if k not in (current or {})}
    if not missing:
        return []
    if current is None:
        return [_add(f"{base}/{name}", missing)]
    return [_add(f"{base}/{name}/{_escape(k)}", v) for k, v in missing.items()]


def _add(path: str, value: Any) -> dict[str, Any]:
    return {"op": "add", "path": path, "value": value}


def _escape(key: str) -> str:
    """A JSON-pointer token for a map key (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def _node_labels(selector: Mapping[str, Any] | None) -> dict[str, str]:
    """The node labels a pod selects from the group's label selector (matchLabels alone
    when the selector is one the controller refuses: that group is not in the scheduler)."""
    try:
        return node_labels(selector)
    except InvalidArgumentError:
        return {str(k): str(v) for k, v in ((selector or {}).get("matchLabels") or {}).items()}
