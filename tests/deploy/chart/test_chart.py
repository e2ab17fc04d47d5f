"""The Helm chart, rendered by the real helm binary.

- `helm lint --strict` passes with default values and with every optional feature on
- every rendered object validates with kubernetes-validate (strict) for a current
  Kubernetes; custom kinds (cert-manager, Prometheus Operator) are named and counted
- namespaced objects live in the release namespace; cluster-scoped ones have none
- every object carries the standard app.kubernetes.io labels
- values.schema.json: additionalProperties false on every object; a typo fails the install
- every RBAC rule has a comment naming the feature that needs it; one ServiceAccount each
- the agent: hostPID, host /proc read-only, only SYS_PTRACE and KILL unless privileged
  (and DAC_OVERRIDE with the sim backend)
- the webhook: opt-in by label, system and own namespaces skipped, fails open, short
  timeout, path = the operator's handler id, caBundle = the generated CA
- the operator: one replica, Recreate; the scheduler: gRPC probes on the overall health
- the scheduler elects a leader by default (2 replicas, both Ready, Lease RBAC narrowed to
  its Lease, pods patch for the leader label, a rolling update that keeps one serving,
  replicas spread over nodes, a PDB of one); the gRPC Service selects the leader label,
  the metrics Service every replica; more replicas without election or the shared store
  are refused
- with TLS the scheduler's readiness follows the metrics port (leader and standby open it)
- env variables the chart sets are flags the commands really read (operator, agent,
  scheduler); server TLS variables are component-prefixed, never the client's names
- the sim backend's root is the same folder for the agent and the webhook, inside the
  socket directory that labelled pods mount
- NOTES render with the verification commands
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from .conftest import (
    ALL_FEATURES,
    CHART,
    NAMESPACE,
    RELEASE,
    env_of,
    find,
    render,
    run_helm,
)

CLUSTER_SCOPED = {
    "ClusterRole",
    "ClusterRoleBinding",
    "MutatingWebhookConfiguration",
    "CustomResourceDefinition",
}
CUSTOM_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule", "Certificate", "Issuer"}
K8S_VERSION = kubernetes_validate.latest_version()


@pytest.mark.parametrize("values", [[], [ALL_FEATURES]], ids=["defaults", "all-features"])
def test_helm_lint_strict_passes(helm: Path, values: list[Path]) -> None:
    args = ["lint", "--strict", str(CHART), "--namespace", NAMESPACE]
    for file in values:
        args += ["--values", str(file)]
    result = run_helm(helm, *args)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("which", ["default_objects", "full_objects"])
def test_every_rendered_object_is_valid_kubernetes(
    which: str, request: pytest.FixtureRequest
) -> None:
    objects: list[dict[str, Any]] = request.getfixturevalue(which)
    custom = []
    for obj in objects:
        if obj["kind"] in CUSTOM_KINDS:
            custom.append(obj["kind"])
            continue
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    if which == "full_objects":
        assert sorted(custom) == [
            "Certificate",
            "Issuer",
            "PodMonitor",
            "PrometheusRule",
            "ServiceMonitor",
        ]
    else:
        assert custom == []


def test_the_defaults_render_every_component(default_objects: list[dict[str, Any]]) -> None:
    kinds = {
        (o["kind"], o["metadata"]["labels"]["app.kubernetes.io/component"]) for o in default_objects
    }
    assert {
        ("Deployment", "scheduler"),
        ("Service", "scheduler"),
        ("Deployment", "operator"),
        ("Deployment", "webhook"),
        ("PodDisruptionBudget", "webhook"),
        ("Service", "webhook"),
        ("MutatingWebhookConfiguration", "webhook"),
        ("DaemonSet", "agent"),
        ("Role", "scheduler"),
        ("Role", "operator"),
    } <= kinds
    # GitOps: no secret values are rendered (the operator makes them at run time).
    assert not [o for o in default_objects if o["kind"] == "Secret"]


@pytest.mark.parametrize("which", ["default_objects", "full_objects"])
def test_namespaced_objects_live_in_the_release_namespace(
    which: str, request: pytest.FixtureRequest
) -> None:
    for obj in request.getfixturevalue(which):
        namespace = obj["metadata"].get("namespace")
        if obj["kind"] in CLUSTER_SCOPED:
            assert namespace is None, obj["metadata"]["name"]
        elif obj["kind"] in ("Role", "RoleBinding") and obj["metadata"]["name"].endswith(
            "-job-token"
        ):
            assert namespace in {"rl", "rl-eval"}  # the job namespaces asked for
        else:
            assert namespace == NAMESPACE, (obj["kind"], obj["metadata"]["name"])


def test_no_template_hard_codes_a_namespace() -> None:
    for template in (CHART / "templates").glob("*.yaml"):
        for line in template.read_text().splitlines():
            if re.match(r"\s*namespace:\s*\S", line):
                assert "{{" in line, f"{template.name}: {line.strip()}"


@pytest.mark.parametrize("which", ["default_objects", "full_objects"])
def test_every_object_has_the_standard_labels(which: str, request: pytest.FixtureRequest) -> None:
    for obj in request.getfixturevalue(which):
        labels = obj["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/name") == "rlslice", obj["metadata"]["name"]
        assert labels.get("app.kubernetes.io/instance") == RELEASE
        assert labels.get("app.kubernetes.io/managed-by") == "Helm"
        assert labels.get("app.kubernetes.io/component")


def _objects_without_additional_properties(schema: Any, path: str = "$") -> list[str]:
    found: list[str] = []
    if isinstance(schema, dict):
        passthrough = "(passed to Kubernetes as is)" in schema.get("description", "")
        closed = schema.get("additionalProperties", None)
        if (
            schema.get("type") == "object"
            and not passthrough
            and (closed is None or (schema.get("properties") and closed is not False))
        ):
            found.append(path)
        for key, value in schema.items():
            found += _objects_without_additional_properties(value, f"{path}.{key}")
    elif isinstance(schema, list):
        for index, value in enumerate(schema):
            found += _objects_without_additional_properties(value, f"{path}[{index}]")
    return found


def test_the_values_schema_closes_every_object() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["additionalProperties"] is False
    assert _objects_without_additional_properties(schema) == []


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        ("scheduler.replica=2", "replica"),
        ("agent.privilged=true", "privilged"),
        ("webhok.enabled=false", "webhok"),
        ("agent.backend=gpu", "backend"),
        ("scheduler.grpcPort=70000", "grpcPort"),
    ],
)
def test_a_values_typo_fails_the_schema(helm: Path, setting: str, field: str) -> None:
    result = run_helm(helm, "template", RELEASE, str(CHART), "--set", setting)
    assert result.returncode != 0
    assert "schema" in result.stderr.lower()
    assert field in result.stderr


@pytest.mark.parametrize(
    "sets",
    [
        ["scheduler.replicas=2", "scheduler.store=memory"],
        ["scheduler.replicas=2", "scheduler.leaderElection.enabled=false"],
    ],
    ids=["unshared-store", "election-off"],
)
def test_several_scheduler_replicas_need_election_and_the_shared_store(
    helm: Path, sets: list[str]
) -> None:
    args = ["template", RELEASE, str(CHART)]
    for item in sets:
        args += ["--set", item]
    result = run_helm(helm, *args)
    assert result.returncode != 0
    assert "scheduler.replicas > 1 needs scheduler.leaderElection.enabled" in result.stderr


@pytest.mark.parametrize("tls", ["false", "true"])
def test_an_agent_without_its_token_is_not_rendered_even_with_mutual_tls(
    helm: Path, tls: str
) -> None:
    # Any certificate of the CA (a job's pod may hold one) must not act as the scheduler.
    args = ["template", RELEASE, str(CHART), "--set", "tokens.enabled=false"]
    args += ["--set", f"tls.enabled={tls}", "--set", "tls.secretName=rlslice-tls"]
    result = run_helm(helm, *args)
    assert result.returncode != 0
    assert "agent: listening beyond loopback needs tokens.enabled" in result.stderr


def test_the_scheduler_elects_a_leader_by_default(default_objects: list[dict[str, Any]]) -> None:
    scheduler = find(default_objects, "Deployment", "scheduler")
    name = scheduler["metadata"]["name"]
    assert scheduler["spec"]["replicas"] == 2
    env = env_of(scheduler)
    assert env["RLSLICE_LEADER_ELECT"] == "true"
    assert env["RLSLICE_LEASE_NAME"] == name
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    # Every replica is Ready, so a rollout keeps one serving while it replaces the other.
    assert scheduler["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = scheduler["spec"]["template"]["spec"]
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    # The standby counts as available, so a budget lets a drain take one replica at a time.
    budget = find(default_objects, "PodDisruptionBudget", "scheduler")
    assert budget["spec"]["maxUnavailable"] == 1
    # gRPC reaches the leader only (the label it sets on its pod); metrics every replica.
    services = {
        o["metadata"]["name"]: o["spec"]["selector"]
        for o in default_objects
        if o["kind"] == "Service"
        and o["metadata"]["labels"]["app.kubernetes.io/component"] == "scheduler"
    }
    assert services[name]["rlslice.dev/leader"] == "true"
    assert "rlslice.dev/leader" not in services[f"{name}-metrics"]
    rules = find(default_objects, "Role", "scheduler")["rules"]
    assert {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]} in rules
    leases = [r for r in rules if r["resources"] == ["leases"]]
    assert {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "resourceNames": [name],
        "verbs": ["get", "patch"],
    } in leases
    assert {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "verbs": ["create"],
    } in leases


def test_one_scheduler_replica_gets_a_disruption_budget(helm: Path) -> None:
    objects = render(helm, sets=["scheduler.replicas=1"])
    budget = find(objects, "PodDisruptionBudget", "scheduler")
    assert budget["spec"]["maxUnavailable"] == 1
    assert "affinity" not in find(objects, "Deployment", "scheduler")["spec"]["template"]["spec"]


def test_the_kubernetes_store_gets_configmaps_in_its_namespace_only(
    default_objects: list[dict[str, Any]], full_objects: list[dict[str, Any]]
) -> None:
    role = find(default_objects, "Role", "scheduler")
    assert role["rules"][0] == {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "verbs": ["get", "list", "create", "patch", "delete"],
    }
    assert {r["resources"][0] for r in role["rules"]} == {"configmaps", "leases", "pods"}
    assert (
        find(default_objects, "RoleBinding", "scheduler")["subjects"][0]["namespace"] == NAMESPACE
    )
    scheduler = find(default_objects, "Deployment", "scheduler")
    assert env_of(scheduler)["RLSLICE_STORE"] == "kubernetes"
    assert scheduler["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
    # The SQLite store needs no API access: no Role, no token, no election.
    assert not [
        o
        for o in full_objects
        if o["kind"] == "Role"
        and o["metadata"]["labels"]["app.kubernetes.io/component"] == "scheduler"
    ]
    sqlite = find(full_objects, "Deployment", "scheduler")
    assert sqlite["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    assert "RLSLICE_LEADER_ELECT" not in env_of(sqlite)


def test_every_rbac_rule_says_which_feature_needs_it() -> None:
    for template in (CHART / "templates").glob("*.yaml"):
        lines = template.read_text().splitlines()
        for index, line in enumerate(lines):
            if line.strip().startswith("- apiGroups:"):
                above = lines[index - 1].strip()
                assert above.startswith("#"), f"{template.name}:{index + 1} has no comment"


def test_each_component_has_its_own_service_account(default_objects: list[dict[str, Any]]) -> None:
    accounts = {
        o["metadata"]["labels"]["app.kubernetes.io/component"]: o["metadata"]["name"]
        for o in default_objects
        if o["kind"] == "ServiceAccount"
    }
    assert set(accounts) == {"scheduler", "operator", "webhook", "agent"}
    for kind, component in [
        ("Deployment", "scheduler"),
        ("Deployment", "operator"),
        ("Deployment", "webhook"),
        ("DaemonSet", "agent"),
    ]:
        pod = find(default_objects, kind, component)["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == accounts[component]


def test_the_agent_gets_only_the_capabilities_it_needs(
    default_objects: list[dict[str, Any]],
) -> None:
    daemonset = find(default_objects, "DaemonSet", "agent")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    security = pod["containers"][0]["securityContext"]
    assert security["privileged"] is False
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE", "KILL"]}
    assert security["allowPrivilegeEscalation"] is False
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["host-proc"]["readOnly"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["host-proc"]["hostPath"]["path"] == "/proc"
    assert volumes["socket"]["hostPath"]["path"] == "/run/rlslice"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert "nvidia.com/gpu" not in json.dumps(pod["containers"][0]["resources"])


def test_a_sim_agent_may_also_read_the_jobs_buffers(helm: Path) -> None:
    # sim parks the jobs' emulated device buffers, 0600 files of the jobs' own users.
    objects = render(helm, sets=["agent.backend=sim"])
    pod = find(objects, "DaemonSet", "agent")["spec"]["template"]["spec"]
    added = pod["containers"][0]["securityContext"]["capabilities"]["add"]
    assert added == ["SYS_PTRACE", "KILL", "DAC_OVERRIDE"]


def test_the_agent_runs_privileged_only_when_a_value_says_so(
    full_objects: list[dict[str, Any]],
) -> None:
    pod = find(full_objects, "DaemonSet", "agent")["spec"]["template"]["spec"]
    assert pod["containers"][0]["securityContext"] == {"privileged": True}
    assert pod["runtimeClassName"] == "nvidia"


def test_the_webhook_is_opt_in_fails_closed_and_skips_system_namespaces(
    default_objects: list[dict[str, Any]],
) -> None:
    from rlslice.operator.handlers import WEBHOOK_ID

    configuration = find(default_objects, "MutatingWebhookConfiguration")
    (hook,) = configuration["webhooks"]
    assert hook["failurePolicy"] == "Fail"
    assert hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["timeoutSeconds"] <= 10
    assert hook["objectSelector"]["matchExpressions"] == [
        {"key": "rlslice.dev/group", "operator": "Exists"}
    ]
    (expression,) = hook["namespaceSelector"]["matchExpressions"]
    assert expression["operator"] == "NotIn"
    assert {"kube-system", "kube-public", "kube-node-lease", NAMESPACE} <= set(expression["values"])
    assert hook["clientConfig"]["service"]["path"] == f"/{WEBHOOK_ID}"
    # No CA at render time: the controller makes the certificate and writes its CA.
    assert "caBundle" not in hook["clientConfig"]
    controller = env_of(find(default_objects, "Deployment", "operator"))
    assert controller["RLSLICE_OPERATOR_WEBHOOK_CONFIGURATION"] == configuration["metadata"]["name"]
    service = find(default_objects, "Service", "webhook")["metadata"]["name"]
    assert controller["RLSLICE_OPERATOR_WEBHOOK_NAMES"].split(",") == [
        service,
        f"{service}.{NAMESPACE}",
        f"{service}.{NAMESPACE}.svc",
    ]
    webhook = find(default_objects, "Deployment", "webhook")
    volumes = {v["name"]: v for v in webhook["spec"]["template"]["spec"]["volumes"]}
    assert (
        volumes["webhook-tls"]["secret"]["secretName"]
        == (controller["RLSLICE_OPERATOR_WEBHOOK_TLS_SECRET"])
    )
    rules = find(default_objects, "ClusterRole", "operator")["rules"]
    assert {
        "apiGroups": ["admissionregistration.k8s.io"],
        "resources": ["mutatingwebhookconfigurations"],
        "resourceNames": [configuration["metadata"]["name"]],
        "verbs": ["get", "patch"],
    } in rules


def test_the_webhook_runs_highly_available_and_is_ready_on_its_port(
    default_objects: list[dict[str, Any]],
) -> None:
    webhook = find(default_objects, "Deployment", "webhook")
    assert webhook["spec"]["replicas"] == 2
    assert env_of(webhook)["RLSLICE_OPERATOR_ROLE"] == "webhook"
    container = webhook["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["tcpSocket"] == {"port": "webhook"}
    pod = webhook["spec"]["template"]["spec"]
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    budget = find(default_objects, "PodDisruptionBudget", "webhook")
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["selector"] == webhook["spec"]["selector"]
    service = find(default_objects, "Service", "webhook")
    assert service["spec"]["selector"] == webhook["spec"]["selector"]["matchLabels"]
    # The webhook writes nothing: read-only RBAC.
    rules = find(default_objects, "ClusterRole", "webhook")["rules"]
    assert {verb for rule in rules for verb in rule["verbs"]} <= {"get", "list", "watch"}
    # The controller: readiness on kopf's health endpoint, no webhook port.
    operator = find(default_objects, "Deployment", "operator")
    container = operator["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert env_of(operator)["RLSLICE_OPERATOR_ROLE"] == "controller"
    assert {p["name"] for p in container["ports"]} == {"health"}


def test_cert_manager_replaces_the_generated_certificate(
    full_objects: list[dict[str, Any]],
) -> None:
    configuration = find(full_objects, "MutatingWebhookConfiguration")
    assert configuration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].startswith(
        f"{NAMESPACE}/"
    )
    assert "caBundle" not in configuration["webhooks"][0]["clientConfig"]
    certificate = find(full_objects, "Certificate")
    assert (
        f"{certificate['spec']['dnsNames'][0]}.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
    )
    controller = env_of(find(full_objects, "Deployment", "operator"))
    assert "RLSLICE_OPERATOR_WEBHOOK_TLS_SECRET" not in controller


def test_the_operator_runs_alone_and_the_scheduler_is_probed_over_grpc(
    default_objects: list[dict[str, Any]],
) -> None:
    operator = find(default_objects, "Deployment", "operator")
    assert operator["spec"]["replicas"] == 1
    assert operator["spec"]["strategy"] == {"type": "Recreate"}
    scheduler = find(default_objects, "Deployment", "scheduler")
    container = scheduler["spec"]["template"]["spec"]["containers"][0]
    # The overall health, which a standby reports SERVING too: every healthy replica is Ready.
    assert "service" not in container["readinessProbe"]["grpc"]
    assert "grpc" in container["livenessProbe"]
    ports = {
        p["name"]
        for o in default_objects
        if o["kind"] == "Service"
        and o["metadata"]["labels"]["app.kubernetes.io/component"] == "scheduler"
        for p in o["spec"]["ports"]
    }
    assert ports == {"grpc", "metrics"}


def test_tls_mounts_the_secret_and_switches_probes_to_tcp(
    full_objects: list[dict[str, Any]],
) -> None:
    scheduler = find(full_objects, "Deployment", "scheduler")
    pod = scheduler["spec"]["template"]["spec"]
    assert pod["volumes"][0]["secret"]["secretName"] == "rlslice-tls"
    # Ready = the metrics port, which leader and standby open; alive = the gRPC port.
    assert pod["containers"][0]["readinessProbe"]["tcpSocket"] == {"port": "metrics"}
    assert pod["containers"][0]["livenessProbe"]["tcpSocket"] == {"port": "grpc"}
    env = env_of(scheduler)
    assert env["RLSLICE_SCHEDULER_TLS_CERT"] == "/etc/rlslice/tls/tls.crt"
    assert env["RLSLICE_SCHEDULER_AGENT_TLS_CA"] == "/etc/rlslice/tls/ca.crt"
    agent = env_of(find(full_objects, "DaemonSet", "agent"))
    assert agent["RLSLICE_AGENT_SERVER_TLS_CERT"] == "/etc/rlslice/tls/tls.crt"
    # The client's names (RLSLICE_TLS_*) and the old ambiguous ones are set nowhere.
    for workload in (scheduler, find(full_objects, "DaemonSet", "agent")):
        names = set(env_of(workload))
        assert not names & {
            "RLSLICE_TLS_CERT",
            "RLSLICE_TLS_KEY",
            "RLSLICE_AGENT_TLS_CERT",
            "RLSLICE_AGENT_TLS_KEY",
            "RLSLICE_AGENT_TLS_CA",
        }
    assert (
        env_of(find(full_objects, "Deployment", "webhook"))["RLSLICE_OPERATOR_TLS_CA_SECRET"]
        == "rlslice-ca"
    )


def test_tokens_come_from_one_secret_the_operator_makes_and_copies_to_job_namespaces(
    full_objects: list[dict[str, Any]],
) -> None:
    operator = find(full_objects, "Deployment", "operator")
    env = env_of(operator)
    secret = env["RLSLICE_OPERATOR_TOKENS_SECRET"]
    assert env["RLSLICE_OPERATOR_JOB_NAMESPACES"] == "rl,rl-eval"
    assert "RLSLICE_ADMIN_TOKEN" not in env  # read from the Secret it makes
    for kind, component, variable in [
        ("Deployment", "scheduler", "RLSLICE_JOB_TOKEN"),
        ("DaemonSet", "agent", "RLSLICE_AGENT_TOKEN"),
    ]:
        reference = env_of(find(full_objects, kind, component))[variable]
        assert reference["secretKeyRef"]["name"] == secret
    roles = {
        o["metadata"]["namespace"]: o
        for o in full_objects
        if o["kind"] == "Role" and o["metadata"]["name"].endswith("-job-token")
    }
    assert set(roles) == {"rl", "rl-eval"}
    assert roles["rl"]["rules"][1]["resourceNames"] == [env["RLSLICE_OPERATOR_JOB_TOKEN_SECRET"]]
    release_role = find(full_objects, "Role", "operator")
    assert release_role["rules"][1]["resourceNames"] == [secret]  # cert-manager: no TLS one


def test_an_existing_tokens_secret_is_read_and_nothing_is_made(helm: Path) -> None:
    objects = render(helm, sets=["tokens.existingSecret=mine"])
    env = env_of(find(objects, "Deployment", "operator"))
    assert "RLSLICE_OPERATOR_TOKENS_SECRET" not in env
    assert env["RLSLICE_ADMIN_TOKEN"]["secretKeyRef"]["name"] == "mine"
    assert env_of(find(objects, "Deployment", "scheduler"))["RLSLICE_JOB_TOKEN"][
        "secretKeyRef"
    ] == {"name": "mine", "key": "job-token"}


def _literal_env(workload: dict[str, Any]) -> dict[str, str]:
    return {
        name: value
        for name, value in env_of(workload).items()
        if isinstance(value, str) and "$(" not in value
    }


def _parse(
    configure: Any, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> argparse.Namespace:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    parser = argparse.ArgumentParser()
    configure(parser)
    return parser.parse_args([])


def _as_flag(configure: Any, dest: str, value: str) -> Any:
    """What `--DEST VALUE` on the command line parses to: the flags are typed."""
    parser = argparse.ArgumentParser()
    configure(parser)
    return getattr(parser.parse_args(["--" + dest.replace("_", "-"), value]), dest)


@pytest.mark.parametrize("which", ["default_objects", "full_objects"])
def test_the_operator_reads_every_variable_the_chart_sets(
    which: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlslice.apps import operator as _cmd

    for component in ("operator", "webhook"):
        workload = find(request.getfixturevalue(which), "Deployment", component)
        env = _literal_env(workload)
        assert env.pop("RLSLICE_NAMESPACE", None) is None  # from the downward API
        args = _parse(_cmd.configure, env, monkeypatch)
        for name, value in env.items():
            dest = name.removeprefix("RLSLICE_OPERATOR_").lower()
            assert getattr(args, dest) == _as_flag(_cmd.configure, dest, value), name
    assert env_of(find(request.getfixturevalue(which), "Deployment", "operator"))[
        "RLSLICE_NAMESPACE"
    ] == {"fieldRef": {"fieldPath": "metadata.namespace"}}


# Server certificates: component-prefixed names (the flags keep their short names).
AGENT_RENAMED = {
    "RLSLICE_AGENT_SERVER_TLS_CERT": "tls_cert",
    "RLSLICE_AGENT_SERVER_TLS_KEY": "tls_key",
    "RLSLICE_AGENT_SERVER_TLS_CLIENT_CA": "tls_client_ca",
}


@pytest.mark.parametrize("which", ["default_objects", "full_objects"])
def test_the_agent_reads_every_variable_the_chart_sets(
    which: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlslice.apps import agent as _cmd

    workload = find(request.getfixturevalue(which), "DaemonSet", "agent")
    env = _literal_env(workload)
    env.pop("NVIDIA_VISIBLE_DEVICES")  # read by the NVIDIA container runtime
    env.pop("NVIDIA_DRIVER_CAPABILITIES")
    assert "RLSLICE_AGENT_TOKEN" in env_of(workload)  # from the tokens Secret, not a flag
    monkeypatch.setenv("RLSLICE_AGENT_TOKEN", "agent-secret")
    args = _parse(_cmd.configure, env, monkeypatch)
    for name, value in env.items():
        dest = AGENT_RENAMED.get(name, name.removeprefix("RLSLICE_AGENT_").lower())
        parsed = getattr(args, dest)
        # A switch's variable parses to a boolean; every other flag as its flag given the text.
        if isinstance(parsed, bool):
            assert str(parsed).lower() == value, name
        else:
            assert parsed == _as_flag(_cmd.configure, dest, value), name
    monkeypatch.setenv("NODE_NAME", "ip-10-0-1-7.ec2.internal")  # the downward API
    settings = _cmd.settings_from(args)
    assert settings.backend == env["RLSLICE_AGENT_BACKEND"]
    assert settings.token == "agent-secret"
    assert settings.node.startswith("ip-10-0-1-7-ec2-internal-")


@pytest.mark.parametrize("which", ["default_objects", "full_objects"])
def test_the_scheduler_reads_every_variable_the_chart_sets(
    which: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlslice.apps import scheduler as _cmd

    workload = find(request.getfixturevalue(which), "Deployment", "scheduler")
    env = _literal_env(workload)
    env.pop("EXTRA_SETTING", None)  # scheduler.extraEnv: the user's, not the command's
    if "RLSLICE_LEADER_ELECT" in env_of(workload):
        env["POD_NAME"] = "rls-scheduler-abc"  # from the downward API
    args = _parse(_cmd.configure, env, monkeypatch)
    for name in env:
        # Read = changing the variable changes what the command parses.
        # A switch is flipped (its variable must parse as a boolean); others get a suffix.
        flipped = {"true": "false", "1": "0"}.get(env[name].lower(), env[name] + "1")
        changed = _parse(_cmd.configure, {name: flipped}, monkeypatch)
        monkeypatch.setenv(name, env[name])
        assert vars(changed) != vars(args), f"{name} is not read by rlslice scheduler"
    settings = _cmd.settings_from(args)
    if "RLSLICE_SCHEDULER_TLS_CERT" in env:
        assert settings.tls is not None
        assert str(settings.tls.cert) == env["RLSLICE_SCHEDULER_TLS_CERT"]
        assert settings.agent_tls is not None
    if "RLSLICE_LEADER_ELECT" in env:
        election = _cmd.election_from(args)
        assert election is not None
        assert election.identity == "rls-scheduler-abc"
        assert election.name == env["RLSLICE_LEASE_NAME"]
    for role in ("job", "admin", "agent"):
        name = f"RLSLICE_{role.upper()}_TOKEN"
        assert name in env_of(workload)
        monkeypatch.setenv(name, f"{role}-secret")
        assert _cmd._token(args, role) == f"{role}-secret"


def test_the_notes_show_how_to_verify_the_install(helm: Path) -> None:
    result = run_helm(
        helm, "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client"
    )
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "kubectl get tsg -w" in notes
    assert f"get lease {RELEASE}-scheduler" in notes  # the leader, with election on
    assert "kubectl get crd timeslicegroups.rlslice.dev" in notes


def test_render_uses_the_release_namespace_given(helm: Path) -> None:
    objects = render(helm, sets=["webhook.enabled=false"])
    assert not [o for o in objects if o["kind"] == "MutatingWebhookConfiguration"]
    operator = find(objects, "Deployment", "operator")
    assert env_of(operator)["RLSLICE_OPERATOR_WEBHOOK_PORT"] == "0"


def test_the_agent_and_the_webhook_agree_on_the_sim_root(
    default_objects: list[dict[str, Any]],
) -> None:
    agent = find(default_objects, "DaemonSet", "agent")
    root = env_of(agent)["RLSLICE_AGENT_SIM_ROOT"]
    assert (
        env_of(find(default_objects, "Deployment", "webhook"))["RLSLICE_OPERATOR_SIM_ROOT"] == root
    )
    socket_dir = {v["name"]: v for v in agent["spec"]["template"]["spec"]["volumes"]}["socket"]
    # Inside the hostPath that labelled pods mount at the same path.
    assert root.startswith(socket_dir["hostPath"]["path"] + "/")


def test_the_agent_runs_in_kubernetes_mode_on_its_nodes_name(
    default_objects: list[dict[str, Any]],
) -> None:
    env = env_of(find(default_objects, "DaemonSet", "agent"))
    assert env["RLSLICE_AGENT_KUBERNETES"] == "true"
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["RLSLICE_AGENT_PROC_ROOT"] == "/host/proc"
    # The node name comes from NODE_NAME through the label mapping, never verbatim.
    assert "RLSLICE_AGENT_NODE" not in env


def test_the_scheduler_is_told_it_may_serve_open_only_when_tokens_are_turned_off(
    helm: Path, default_objects: list[dict[str, Any]]
) -> None:
    # With tokens on, every role is authenticated and the scheduler needs no opt-in; with
    # tokens off (TLS on, which only encrypts), the chart says the open port is meant, or the
    # scheduler would refuse to start (rlslice.scheduler.settings.check_exposure).
    assert "RLSLICE_ALLOW_UNAUTHENTICATED" not in env_of(
        find(default_objects, "Deployment", "scheduler")
    )
    objects = render(
        helm,
        sets=[
            "tokens.enabled=false",
            "tls.enabled=true",
            "tls.secretName=rlslice-tls",
            "agent.enabled=false",
        ],
    )
    env = env_of(find(objects, "Deployment", "scheduler"))
    assert env["RLSLICE_ALLOW_UNAUTHENTICATED"] == "true"
    assert "RLSLICE_JOB_TOKEN" not in env
