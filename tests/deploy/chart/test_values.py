"""The chart's common values, GitOps rendering and alerts, with the real helm binary.

Case matrix:
- render twice (defaults; every feature on) -> byte-identical manifests (no random values,
  no lookup);
- as a dependency of a throwaway umbrella chart that sets `global` -> renders, passes the
  schema, uses global.imageRegistry and global.imagePullSecrets, and every object still
  validates (kubernetes-validate, strict);
- nameOverride / fullnameOverride -> object names and the name label follow;
- image registry + digest -> `registry/repository@digest`;
- per-component values (all-features.yaml): serviceAccount annotations, create=false with
  a name, podAnnotations, podLabels, podSecurityContext and securityContext merged over
  the chart's, priorityClassName, extraArgs, extraEnv, extraVolumes/Mounts, updateStrategy;
- the agent lands on GPU nodes by default and nowhere is system-node-critical forced;
- the SQLite store gets a volume (a PVC with persistence, an emptyDir without);
- ServiceMonitor/PodMonitor carry relabelings; NetworkPolicies cover every component;
- every metric an alert names is one the scheduler or the agent really exports.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from .conftest import ALL_FEATURES, CHART, NAMESPACE, RELEASE, env_of, find, render, run_helm

CUSTOM_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule", "Certificate", "Issuer"}


def _template(helm: Path, *args: str) -> str:
    result = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_rendering_twice_gives_the_same_manifests(helm: Path) -> None:
    for args in ([], ["--values", str(ALL_FEATURES)]):
        first, second = _template(helm, *args), _template(helm, *args)
        assert first == second


def test_the_chart_works_as_a_dependency_of_an_umbrella_setting_global(
    helm: Path, tmp_path: Path
) -> None:
    umbrella = tmp_path / "umbrella"
    (umbrella / "charts").mkdir(parents=True)
    (umbrella / "templates").mkdir()
    (umbrella / "templates" / "NOTES.txt").write_text("platform {{ .Chart.Version }}\n")
    shutil.copytree(CHART, umbrella / "charts" / "rlslice")
    (umbrella / "Chart.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v2",
                "name": "platform",
                "version": "1.0.0",
                "dependencies": [{"name": "rlslice", "version": "0.1.0"}],
            }
        )
    )
    (umbrella / "values.yaml").write_text(
        yaml.safe_dump(
            {
                "global": {
                    "imageRegistry": "mirror.example.test",
                    "imagePullSecrets": ["mirror-cred"],
                    "somethingElse": {"the": "umbrella's own"},
                },
                "rlslice": {"webhook": {"replicas": 3}},
            }
        )
    )
    result = run_helm(helm, "lint", "--strict", str(umbrella))
    assert result.returncode == 0, result.stdout + result.stderr
    result = run_helm(helm, "template", "platform", str(umbrella), "--namespace", NAMESPACE)
    assert result.returncode == 0, result.stderr
    objects = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    for obj in objects:
        if obj["kind"] not in CUSTOM_KINDS:
            kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)
    webhook = find(objects, "Deployment", "webhook")
    assert webhook["spec"]["replicas"] == 3
    pod = webhook["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "mirror.example.test/rlslice:0.1.0"
    assert pod["imagePullSecrets"] == [{"name": "mirror-cred"}]


def test_name_overrides_rename_every_object(helm: Path) -> None:
    named = render(helm, sets=["nameOverride=slicer"])
    assert (
        find(named, "Deployment", "scheduler")["metadata"]["name"] == f"{RELEASE}-slicer-scheduler"
    )
    assert {o["metadata"]["labels"]["app.kubernetes.io/name"] for o in named} == {"slicer"}
    full = render(helm, sets=["fullnameOverride=gpu-share"])
    names = {o["metadata"]["name"] for o in full if o["kind"] != "CustomResourceDefinition"}
    assert all(name.startswith("gpu-share-") for name in names), names


def test_the_image_takes_a_registry_and_a_digest(full_objects: list[dict[str, Any]]) -> None:
    for kind, component in [
        ("Deployment", "scheduler"),
        ("Deployment", "operator"),
        ("Deployment", "webhook"),
        ("DaemonSet", "agent"),
    ]:
        pod = find(full_objects, kind, component)["spec"]["template"]["spec"]
        image = pod["containers"][0]["image"]
        assert re.fullmatch(r"registry\.example\.test/mirror/rlslice@sha256:[0-9a-f]{64}", image)
        assert pod["imagePullSecrets"] == [{"name": "global-cred"}, {"name": "regcred"}]


def test_per_component_values_reach_the_pods(full_objects: list[dict[str, Any]]) -> None:
    scheduler = find(full_objects, "Deployment", "scheduler")
    pod = scheduler["spec"]["template"]
    assert pod["metadata"]["annotations"] == {"example.test/scrape": "true"}
    assert pod["metadata"]["labels"]["team"] == "rl-infra"
    spec = pod["spec"]
    assert spec["priorityClassName"] == "rlslice-high"
    # Overrides merge over the chart's restricted defaults instead of replacing them.
    assert spec["securityContext"]["runAsUser"] == 10001
    assert spec["securityContext"]["runAsNonRoot"] is True
    container = spec["containers"][0]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["args"][-2:] == ["--shutdown-grace", "10"]
    assert env_of(scheduler)["EXTRA_SETTING"] == "1"
    assert {"name": "scratch", "mountPath": "/scratch"} in container["volumeMounts"]
    assert {"name": "scratch", "emptyDir": {}} in spec["volumes"]
    account = find(full_objects, "ServiceAccount", "scheduler")
    assert account["metadata"]["annotations"] == {"iam.example.test/role": "rlslice-scheduler"}
    assert spec["serviceAccountName"] == account["metadata"]["name"]

    webhook = find(full_objects, "Deployment", "webhook")
    assert webhook["spec"]["template"]["metadata"]["annotations"] == {
        "example.test/owner": "rl-infra"
    }
    agent = find(full_objects, "DaemonSet", "agent")
    assert agent["spec"]["updateStrategy"]["rollingUpdate"] == {"maxUnavailable": "10%"}
    assert agent["spec"]["template"]["spec"]["serviceAccountName"] == "gpu-nodes"
    assert agent["spec"]["template"]["spec"]["priorityClassName"] == "system-node-critical"
    # serviceAccount.create=false: no account and no binding of our own for the agent.
    assert not [
        o
        for o in full_objects
        if o["kind"] in ("ServiceAccount", "ClusterRoleBinding")
        and o["metadata"]["labels"]["app.kubernetes.io/component"] == "agent"
    ]


def test_the_agent_selects_gpu_nodes_by_default_and_takes_no_forced_priority(
    default_objects: list[dict[str, Any]], helm: Path
) -> None:
    pod = find(default_objects, "DaemonSet", "agent")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert "priorityClassName" not in pod
    anywhere = render(helm, sets=["agent.nodeSelector=null"])
    assert "nodeSelector" not in find(anywhere, "DaemonSet", "agent")["spec"]["template"]["spec"]


def test_the_sqlite_store_gets_a_volume(full_objects: list[dict[str, Any]], helm: Path) -> None:
    claim = find(full_objects, "PersistentVolumeClaim", "scheduler")
    assert claim["spec"]["resources"]["requests"]["storage"] == "2Gi"
    assert claim["spec"]["storageClassName"] == "fast"
    spec = find(full_objects, "Deployment", "scheduler")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    mounts = {m["name"]: m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    store = env_of(find(full_objects, "Deployment", "scheduler"))["RLSLICE_STORE"]
    assert store.startswith(mounts["data"] + "/")
    # Without persistence: an emptyDir, still writable under the read-only root.
    objects = render(helm, sets=["scheduler.store=/var/lib/rlslice/s.db", "scheduler.replicas=1"])
    spec = find(objects, "Deployment", "scheduler")["spec"]["template"]["spec"]
    assert {v["name"]: v for v in spec["volumes"]}["data"] == {"name": "data", "emptyDir": {}}


def test_monitors_carry_relabelings_and_network_policies_cover_every_component(
    full_objects: list[dict[str, Any]],
) -> None:
    service_monitor = find(full_objects, "ServiceMonitor")
    (endpoint,) = service_monitor["spec"]["endpoints"]
    assert endpoint["relabelings"][0]["targetLabel"] == "node"
    assert endpoint["metricRelabelings"][0]["action"] == "drop"
    (pod_endpoint,) = find(full_objects, "PodMonitor")["spec"]["podMetricsEndpoints"]
    assert pod_endpoint["relabelings"] == endpoint["relabelings"]
    policies = {
        o["metadata"]["labels"]["app.kubernetes.io/component"]: o
        for o in full_objects
        if o["kind"] == "NetworkPolicy"
    }
    assert set(policies) == {"scheduler", "agent", "operator", "webhook"}
    agent_from = policies["agent"]["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    assert agent_from["app.kubernetes.io/component"] == "scheduler"


def _exported_names() -> set[str]:
    """Every sample name the scheduler (leader and standby) and the agent export."""
    from prometheus_client import CollectorRegistry

    from rlslice.scheduler.leader import _LeaderCollector
    from rlslice.scheduler.metrics import SchedulerMetrics
    from rlslice.snapshot_agent.metrics import AgentMetrics

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    standby = CollectorRegistry()
    standby.register(_LeaderCollector(0.0))
    names: set[str] = set()
    for registry in (SchedulerMetrics().registry, AgentMetrics("node-a").registry, standby):
        for family in registry.collect():
            names.update(family.name + s for s in suffixes.get(family.type, ("",)))
    return names


def test_every_alert_names_metrics_the_components_export(
    full_objects: list[dict[str, Any]], default_objects: list[dict[str, Any]], helm: Path
) -> None:
    elected = render(helm, sets=["metrics.prometheusRule.enabled=true"])
    exported = _exported_names()
    alerts: dict[str, str] = {}
    for objects in (full_objects, elected):
        (group,) = find(objects, "PrometheusRule")["spec"]["groups"]
        alerts.update({rule["alert"]: rule["expr"] for rule in group["rules"]})
    assert set(alerts) == {
        "RlsliceSwitchFailures",
        "RlsliceJobFaulted",
        "RlsliceAcquireWaitLong",
        "RlsliceStoreUnhealthy",
        "RlsliceNoLeader",
    }
    for alert, expr in alerts.items():
        used = set(re.findall(r"\b(rlslice_[a-z_]+)\{", expr))
        assert used, alert
        assert used <= exported, (alert, used - exported)
    assert not [o for o in default_objects if o["kind"] == "PrometheusRule"]
