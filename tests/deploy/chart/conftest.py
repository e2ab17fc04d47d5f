"""The real `helm` binary (from tools/fetch_helm.py) and rendering helpers.

No skip when helm cannot be had: CI has the package registry, so a missing helm is a
failure with the reason, not a silently green chart.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "rlslice"
ALL_FEATURES = Path(__file__).resolve().parent / "all-features.yaml"
NAMESPACE = "rl-system"
RELEASE = "rls"


@pytest.fixture(scope="session")
def helm() -> Path:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "fetch_helm.py")],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(
            "helm is needed for the chart tests and could not be obtained "
            f"(python tools/fetch_helm.py): {result.stderr.strip() or result.stdout.strip()}",
            pytrace=False,
        )
    return Path(result.stdout.strip().splitlines()[-1]) / "helm"


def run_helm(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm), *args], capture_output=True, text=True, timeout=120, check=False
    )


def render(helm: Path, *values: Path, sets: Sequence[str] = ()) -> list[dict[str, Any]]:
    """`helm template` into a list of objects (fails the test on a rendering error)."""
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for file in values:
        args += ["--values", str(file)]
    for item in sets:
        args += ["--set", item]
    result = run_helm(helm, *args)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="session")
def default_objects(helm: Path) -> list[dict[str, Any]]:
    return render(helm)


@pytest.fixture(scope="session")
def full_objects(helm: Path) -> list[dict[str, Any]]:
    return render(helm, ALL_FEATURES)


def find(objects: list[dict[str, Any]], kind: str, component: str | None = None) -> dict[str, Any]:
    for obj in objects:
        labels = obj["metadata"].get("labels", {})
        if obj["kind"] == kind and (
            component is None or labels.get("app.kubernetes.io/component") == component
        ):
            return obj
    raise AssertionError(f"no {kind} ({component}) rendered")


def env_of(workload: dict[str, Any]) -> dict[str, Any]:
    container = workload["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}
