"""The Grafana dashboard in the chart: valid, on the catalogued metrics only, shipped by the chart.

Case matrix:

| checked | how |
|---|---|
| valid dashboard JSON | parses; uid, title, schemaVersion; unique panel ids; panels inside 24 columns and not overlapping |
| every query uses catalogued metrics | each `rlslice_*` identifier in every expr (and template query) is in metrics_catalogue.py (histograms as _bucket/_sum/_count) |
| every label is one the metric has | matchers `{l=...}`, `by/on/group_left (l)` and `{{l}}` legends use the labels of the query's metrics, the target's (instance, job) or `le` |
| every catalogued metric is on some panel | nothing exported goes unseen |
| the panels the issue asks for | busy fraction, queue depth, acquire wait quantiles, switch seconds, switch GB/s, parked bytes per node, device memory used/total |
| the chart ships it | a template reads `dashboards/rlslice.json` with .Files.Get behind `grafana.dashboard.enabled`; values and schema carry the key; .helmignore keeps the file |
| the real `helm template` | no dashboard ConfigMap by default; with the value on, one ConfigMap whose data is the dashboard JSON, with the sidecar label and the annotations given |
| the docs name every metric | docs/observability.md mentions each catalogued name |
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "rlslice"
DASHBOARD = CHART / "dashboards" / "rlslice.json"
SERIES = re.compile(r"\brlslice_[a-z0-9_]+")
SELECTOR = re.compile(r"(rlslice_[a-z0-9_]+)\s*\{([^}]*)\}")
MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
LEGEND = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def queries() -> list[tuple[str, str, str]]:
    """(panel title, expr, legend) of every target."""
    return [
        (p["title"], t["expr"], t.get("legendFormat", "")) for p in panels() for t in p["targets"]
    ]


def test_the_dashboard_is_valid_grafana_json() -> None:
    board = dashboard()
    assert board["uid"] == "rlslice"
    assert board["title"] == "rlslice"
    assert isinstance(board["schemaVersion"], int)
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps another panel"
                cells.add((x, y))
    for panel in panels():
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}"
        assert [t["refId"] for t in panel["targets"]] == [
            chr(ord("A") + i) for i in range(len(panel["targets"]))
        ]
    variables = {v["name"] for v in board["templating"]["list"]}
    assert variables == {"datasource", "group"}


def test_every_query_uses_only_catalogued_metrics(catalogue: ModuleType) -> None:
    template_queries = [
        v["definition"] for v in dashboard()["templating"]["list"] if "definition" in v
    ]
    for title, expr, _ in queries() + [("templating", q, "") for q in template_queries]:
        found = SERIES.findall(expr)
        assert found, f"{title}: no rlslice metric in {expr!r}"
        for series in found:
            assert catalogue.base_name(series), f"{title}: {series} is not in the catalogue"


def test_every_label_is_one_the_metric_carries(catalogue: ModuleType) -> None:
    for title, expr, legend in queries():
        allowed: set[str] = set()
        for series in SERIES.findall(expr):
            allowed |= catalogue.labels_of(series)
        for series, matchers in SELECTOR.findall(expr):
            used = set(MATCHER.findall(matchers))
            assert used <= catalogue.labels_of(series), f"{title}: {series} has no {used}"
        for grouping in GROUPING.findall(expr):
            used = {label.strip() for label in grouping.split(",") if label.strip()}
            assert used <= allowed, f"{title}: grouping by {used - allowed}"
        assert set(LEGEND.findall(legend)) <= allowed, f"{title}: legend {legend!r}"


def test_every_catalogued_metric_is_on_some_panel(catalogue: ModuleType) -> None:
    shown = {catalogue.base_name(s) for _, expr, _ in queries() for s in SERIES.findall(expr)}
    assert set(catalogue.METRICS) - shown == set()


@pytest.mark.parametrize(
    ("title", "fragment"),
    [
        ("Busy fraction per group", 'rlslice_scheduler_busy_fraction{group=~"$group"}'),
        ("Queue depth per group", "rlslice_scheduler_queue_depth"),
        (
            "Acquire wait time",
            "histogram_quantile(0.99, sum by (le) (rate(rlslice_scheduler_acquire_wait_seconds_bucket",
        ),
        ("Switch time", "rlslice_scheduler_switch_seconds_bucket"),
        (
            "Switch throughput (GB/s)",
            "sum(rate(rlslice_scheduler_moved_bytes_total[$__rate_interval])) / sum(rate(rlslice_scheduler_switch_seconds_sum[$__rate_interval]))",
        ),
        (
            "Parked bytes per node",
            "sum by (node) (rlslice_agent_parked_bytes * on (instance) group_left (node) rlslice_agent_info)",
        ),
        ("Device memory used / total", "rlslice_agent_device_total_bytes"),
    ],
)
def test_the_panels_the_issue_asks_for_are_there(title: str, fragment: str) -> None:
    exprs = [expr for t, expr, _ in queries() if t == title]
    assert exprs, f"no panel {title!r}"
    assert any(fragment in expr for expr in exprs)


def test_the_chart_ships_the_dashboard_behind_a_value() -> None:
    templates = [
        p
        for p in (CHART / "templates").glob("*.yaml")
        if "dashboards/rlslice.json" in p.read_text()
    ]
    assert templates, "no chart template reads dashboards/rlslice.json"
    text = templates[0].read_text()
    assert '.Files.Get "dashboards/rlslice.json"' in text
    assert "grafana).dashboard).enabled" in text
    values = CHART / "values.yaml"
    if values.exists():
        import yaml

        grafana = yaml.safe_load(values.read_text()).get("grafana", {})
        assert grafana.get("dashboard", {}).get("enabled") is False  # opt-in
    schema = CHART / "values.schema.json"
    if schema.exists():
        properties = json.loads(schema.read_text()).get("properties", {})
        assert "grafana" in properties
    helmignore = CHART / ".helmignore"
    if helmignore.exists():
        ignored = [line.strip() for line in helmignore.read_text().splitlines()]
        assert not any(line in ("dashboards/", "dashboards", "*.json") for line in ignored)


def test_the_docs_name_every_metric(catalogue: ModuleType) -> None:
    docs = (ROOT / "docs" / "observability.md").read_text()
    missing = [name for name in catalogue.METRICS if name not in docs]
    assert missing == []


@pytest.fixture(scope="module")
def helm() -> Path:
    """The real helm binary (tools/fetch_helm.py, as the chart tests get it)."""
    import subprocess
    import sys

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


def rendered_configmaps(helm: Path, *sets: str) -> list[dict[str, Any]]:
    import subprocess

    import yaml

    args = [str(helm), "template", "rls", str(CHART), "--namespace", "obs"]
    for item in sets:
        args += ["--set", item]
    result = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    return [
        doc
        for doc in yaml.safe_load_all(result.stdout)
        if doc
        and doc["kind"] == "ConfigMap"
        and doc["metadata"]["labels"].get("app.kubernetes.io/component") == "dashboard"
    ]


def test_helm_renders_the_dashboard_configmap_only_when_enabled(helm: Path) -> None:
    assert rendered_configmaps(helm) == []
    (configmap,) = rendered_configmaps(
        helm, "grafana.dashboard.enabled=true", "grafana.dashboard.annotations.folder=GPU"
    )
    assert configmap["metadata"]["namespace"] == "obs"
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["annotations"] == {"folder": "GPU"}
    assert json.loads(configmap["data"]["rlslice.json"]) == dashboard()
