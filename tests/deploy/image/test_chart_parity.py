"""tests/deploy/image run each component as the chart does: the specs in components.py against
the chart rendered by the real `helm` (with the SQLite store, one scheduler replica and the
sim backend, the configuration the container round uses).

Cases, for the scheduler, agent, operator (controller) and webhook containers:
- command `rlslice` and the same args;
- the same user, read-only root, dropped capabilities, host PID namespace, and the added
  capabilities, but for the ones components.py names with a reason;
- every emptyDir the chart mounts is a tmpfs in the test, except the scheduler's store;
- the same env names, but for those components.py names as left out or added, and the
  same values, but for those it names as changed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from . import components

ROOT = Path(__file__).resolve().parents[3]
NAMESPACE = "rl-system"
VALUES = (
    "scheduler.store=/var/lib/rlslice/scheduler.db",
    "scheduler.replicas=1",
    "scheduler.leaderElection.enabled=false",
    "agent.backend=sim",
)
SPECS = {
    "scheduler": components.scheduler("127.0.0.1:50551", 9090),
    "agent": components.agent("127.0.0.1:7071", "127.0.0.1:50551", 9091, "node-a"),
    "operator": components.controller(NAMESPACE),
    "webhook": components.webhook(NAMESPACE),
}


@pytest.fixture(scope="module")
def rendered() -> dict[str, dict[str, Any]]:
    """deployment suffix -> (pod spec, its one container) of the rendered chart."""
    fetched = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "fetch_helm.py")],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if fetched.returncode != 0:
        pytest.fail(f"helm could not be obtained: {fetched.stderr.strip()}", pytrace=False)
    helm = Path(fetched.stdout.strip().splitlines()[-1]) / "helm"
    sets = [item for value in VALUES for item in ("--set", value)]
    out = subprocess.run(
        [str(helm), "template", "rls", str(ROOT / "charts" / "rlslice"), "-n", NAMESPACE, *sets],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    found = {}
    for doc in yaml.safe_load_all(out):
        if doc and doc.get("kind") in ("Deployment", "DaemonSet"):
            pod = doc["spec"]["template"]["spec"]
            (container,) = pod["containers"]
            found[doc["metadata"]["name"].removeprefix("rls-")] = {"pod": pod, "c": container}
    return found


def test_the_chart_has_exactly_the_components_the_tests_run(
    rendered: dict[str, dict[str, Any]],
) -> None:
    assert set(rendered) == set(SPECS)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_command_user_and_security_are_the_charts(
    rendered: dict[str, dict[str, Any]], name: str
) -> None:
    spec, pod, container = SPECS[name], rendered[name]["pod"], rendered[name]["c"]
    assert container["command"] == ["rlslice"]
    assert tuple(container["args"]) == spec.args
    security = container.get("securityContext", {})
    user = security.get("runAsUser", pod.get("securityContext", {}).get("runAsUser"))
    assert user == spec.user
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert set(security["capabilities"].get("add", [])) == set(spec.capabilities)
    assert not set(spec.capabilities_added) & set(spec.capabilities)
    assert bool(pod.get("hostPID")) == spec.host_pid


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_empty_dir_is_a_tmpfs(rendered: dict[str, dict[str, Any]], name: str) -> None:
    pod, container = rendered[name]["pod"], rendered[name]["c"]
    empty = {v["name"] for v in pod.get("volumes", []) if "emptyDir" in v}
    paths = {m["mountPath"] for m in container.get("volumeMounts", []) if m["name"] in empty}
    paths.discard("/var/lib/rlslice")  # the scheduler's store: a host volume in the test
    assert paths == set(SPECS[name].tmpfs)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_env_names_and_values_are_the_charts(
    rendered: dict[str, dict[str, Any]], name: str
) -> None:
    spec = SPECS[name]
    chart = {e["name"]: e.get("value") for e in rendered[name]["c"].get("env", [])}
    assert set(chart) - set(spec.env) == set(spec.env_left_out)
    assert set(spec.env) - set(chart) == set(spec.env_added)
    for key in set(chart) & set(spec.env):
        if key in spec.env_changed:
            continue
        if chart[key] is None:  # valueFrom: a Secret or the downward API
            continue
        assert spec.env[key] == chart[key], key
