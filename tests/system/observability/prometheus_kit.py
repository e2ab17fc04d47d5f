"""The real Prometheus tools for the observability tests: promtool, a Prometheus server, helm.

- `require_tool(name)`: the path of `promtool` or `prometheus` (Debian's `prometheus`
  package). Missing: the test skips, or fails when RLSLICE_REQUIRE_PROMETHEUS=1 (CI).
- `helm_binary()`: the real helm, from tools/fetch_helm.py (as the chart tests get it).
- `render(helm, *sets)`: `helm template rls charts/rlslice --namespace rl-system` as objects.
- `rules_file(objects, path)`: the PrometheusRule's groups as a Prometheus rules file.
- `Prometheus`: a server on 127.0.0.1, started and stopped by pid (the process harness of
  `rlslice.testing`), with `ready()` and `query()` polled against a deadline.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from rlslice.testing import Service, free_port, start_service

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "rlslice"
NAMESPACE = "rl-system"
RELEASE = "rls"
REQUIRE = "RLSLICE_REQUIRE_PROMETHEUS"

T = TypeVar("T")


def require_tool(name: str) -> Path:
    """`name` on PATH; else skip, or fail when RLSLICE_REQUIRE_PROMETHEUS=1."""
    found = shutil.which(name)
    if found:
        return Path(found)
    reason = f"{name} is not on PATH (Debian: apt-get install prometheus)"
    if os.environ.get(REQUIRE) == "1":
        pytest.fail(f"{reason}, and {REQUIRE}=1 says it must be", pytrace=False)
    pytest.skip(reason)


def helm_binary() -> Path:
    """The real helm (tools/fetch_helm.py); a failure, never a skip, when it cannot be had."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "fetch_helm.py")],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(f"helm could not be obtained: {result.stderr.strip()}", pytrace=False)
    return Path(result.stdout.strip().splitlines()[-1]) / "helm"


def run_helm(helm: Path, *sets: str) -> subprocess.CompletedProcess[str]:
    """`helm template` of the chart with `--set` items (the result, not checked)."""
    args = [str(helm), "template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for item in sets:
        args += ["--set", item]
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)


def render(helm: Path, *sets: str) -> list[dict[str, Any]]:
    """The chart's objects as `helm template` renders them (fails the test on an error)."""
    result = run_helm(helm, *sets)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def find(objects: list[dict[str, Any]], kind: str, **labels: str) -> dict[str, Any]:
    """The one rendered object of `kind` carrying `labels`."""
    found = [
        o
        for o in objects
        if o["kind"] == kind
        and all(o["metadata"].get("labels", {}).get(k) == v for k, v in labels.items())
    ]
    assert len(found) == 1, f"{len(found)} {kind} objects with {labels}"
    return found[0]


def rules_file(objects: list[dict[str, Any]], path: Path) -> dict[str, str]:
    """Write the PrometheusRule's groups to `path`; return alert name -> expr."""
    groups = find(objects, "PrometheusRule")["spec"]["groups"]
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return {r["alert"]: r["expr"] for g in groups for r in g["rules"] if "alert" in r}


def poll(probe: Callable[[], T | None], timeout: float, what: str) -> T:
    """The first result of `probe` that is not None, polled until `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result is not None:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.25)


@dataclass
class Prometheus:
    """A real Prometheus on 127.0.0.1, its TSDB in a temporary folder."""

    service: Service
    url: str

    @classmethod
    def start(cls, binary: Path, config: dict[str, Any], folder: Path) -> Prometheus:
        """Write `config` and start `binary` on a free port; `stop()` ends it by its pid."""
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        port = free_port()
        argv = [
            str(binary),
            f"--config.file={folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={folder / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ]
        return cls(start_service(argv, folder / "prometheus.log"), f"http://127.0.0.1:{port}")

    def stop(self) -> None:
        """SIGTERM, wait; SIGKILL only if it must."""
        self.service.stop()

    def _get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as answer:
            return json.loads(answer.read()) if path.startswith("/api/") else answer.status

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Return once /-/ready answers 200; fail at once (with its log) if it exits."""

        def ready() -> bool | None:
            self.service.check_alive()
            try:
                return True if self._get("/-/ready") == 200 else None
            except (urllib.error.URLError, ConnectionError):
                return None

        poll(ready, timeout, f"Prometheus at {self.url} to be ready")

    def api(self, path: str, **params: str) -> Any:
        """`data` of a successful /api/v1/PATH answer."""
        answer = self._get(f"/api/v1/{path}", **params)
        assert answer["status"] == "success", answer
        return answer["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """The series of an instant query (each: `metric` labels, `value`), now or `at` (a
        Unix time)."""
        data = self.api("query", query=expr, **({} if at is None else {"time": f"{at:.3f}"}))
        assert data["resultType"] == "vector", (expr, data["resultType"])
        return list(data["result"])
