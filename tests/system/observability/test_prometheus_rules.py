"""The chart's alerts under the real `promtool`, rendered by the real `helm template`.

`helm template rls charts/rlslice --namespace rl-system --set
metrics.prometheusRule.enabled=true` (leader election is on by default, so every alert is
there); the PrometheusRule's groups become `rules.yaml`, beside
`fixtures/prometheus_rules_test.yaml`, the promtool unit tests.

Case matrix:

| checked | how |
|---|---|
| the rules load | `promtool check rules rules.yaml` |
| each alert fires on its series and stays quiet on the others | `promtool test rules` (exp_alerts with labels and annotations; `[]` for quiet) |
| no alert goes untested | every rendered alert has a case that fires and a case that stays quiet |
| the wait alert can fire | the fixture's highest finite bucket is the one the scheduler exports; a threshold above it is refused by `helm template` |

Without promtool the tests skip, or fail when RLSLICE_REQUIRE_PROMETHEUS=1 (CI).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rlslice.scheduler.metrics import SchedulerMetrics

from .prometheus_kit import helm_binary, render, require_tool, rules_file, run_helm

FIXTURE = Path(__file__).parent / "fixtures" / "prometheus_rules_test.yaml"
RULES_ON = "metrics.prometheusRule.enabled=true"

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def helm() -> Path:
    return helm_binary()


@pytest.fixture(scope="module")
def promtool() -> Path:
    return require_tool("promtool")


@pytest.fixture(scope="module")
def rules(tmp_path_factory: pytest.TempPathFactory, helm: Path) -> tuple[Path, dict[str, str]]:
    """The folder with rules.yaml (rendered) and the promtool tests; alert name -> expr."""
    folder = tmp_path_factory.mktemp("rules")
    alerts = rules_file(render(helm, RULES_ON), folder / "rules.yaml")
    shutil.copy(FIXTURE, folder / FIXTURE.name)
    return folder, alerts


def promtool_run(promtool: Path, folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool), *args], cwd=folder, capture_output=True, text=True, timeout=120
    )


def test_promtool_accepts_the_rendered_rules(
    promtool: Path, rules: tuple[Path, dict[str, str]]
) -> None:
    folder, alerts = rules
    result = promtool_run(promtool, folder, "check", "rules", "rules.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alerts)} rules found" in result.stdout


def test_every_alert_fires_on_its_series_and_stays_quiet_on_the_others(
    promtool: Path, rules: tuple[Path, dict[str, str]]
) -> None:
    folder, _ = rules
    result = promtool_run(promtool, folder, "test", "rules", FIXTURE.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_rendered_alert_has_a_firing_and_a_quiet_case(
    rules: tuple[Path, dict[str, str]],
) -> None:
    _, alerts = rules
    cases = [
        case
        for test in yaml.safe_load(FIXTURE.read_text())["tests"]
        for case in test["alert_rule_test"]
    ]
    fires = {c["alertname"] for c in cases if c.get("exp_alerts")}
    quiet = {c["alertname"] for c in cases if not c.get("exp_alerts")}
    assert set(alerts) == {
        "RlsliceSwitchFailures",
        "RlsliceJobFaulted",
        "RlsliceAcquireWaitLong",
        "RlsliceStoreUnhealthy",
        "RlsliceNoLeader",
    }
    assert fires == set(alerts)
    assert quiet == set(alerts)


def exported_top_bucket() -> float:
    """The highest finite `le` of the acquire-wait histogram, as the scheduler exports it."""
    text = generate_latest(SchedulerMetrics().registry).decode()
    (family,) = (
        f
        for f in text_string_to_metric_families(text)
        if f.name == "rlslice_scheduler_acquire_wait_seconds"
    )
    bounds = [float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")]
    return max(b for b in bounds if b != float("inf"))


def test_the_wait_fixture_ends_at_the_bucket_the_scheduler_exports() -> None:
    fixture = FIXTURE.read_text()
    top = exported_top_bucket()
    assert f'le="{top}"' in fixture
    assert f'le="{top * 2}"' not in fixture


def test_a_wait_threshold_above_the_highest_bucket_is_refused(helm: Path) -> None:
    top = int(exported_top_bucket())
    refused = run_helm(helm, RULES_ON, f"metrics.prometheusRule.acquireWaitSeconds={top + 1}")
    assert refused.returncode != 0
    assert "acquireWaitSeconds" in refused.stderr
    assert f"above {top} s" in refused.stderr
    accepted = run_helm(helm, RULES_ON, f"metrics.prometheusRule.acquireWaitSeconds={top}")
    assert accepted.returncode == 0, accepted.stderr
    assert f">= {top}" in accepted.stdout
