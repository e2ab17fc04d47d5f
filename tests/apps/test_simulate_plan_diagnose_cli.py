"""`rlslice simulate`, `rlslice plan`, `rlslice diagnose`, and the scheduler-metrics rules.

Cases: simulate the article scenario (text, JSON, timeline PNG), jobs from YAML, bad YAML
(exit 2 with the field named); plan a fitting and a non-fitting file (exit 0 / 1, JSON);
diagnose a saved metrics file (per-group hypotheses, failures, slow switches, the
fallback), a live metrics endpoint on 127.0.0.1, and a file with no rlslice metrics.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rlslice.apps.cli import main
from rlslice.planner.scheduler_metrics import (
    ALL_GROUPS,
    FALLBACK,
    diagnose_scheduler_metrics,
    parse_scheduler_metrics,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "module12"


def test_simulate_the_article_scenario_prints_busy_fractions_and_per_job_rows(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["simulate", "--scenario", "article"]) == 0
    out = capsys.readouterr().out
    assert "GPU busy: dedicated 4" in out
    assert "grpo-a" in out
    assert "grpo-b" in out


def test_simulate_json_meets_the_article_target_and_writes_a_timeline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png = tmp_path / "timeline.png"
    assert main(["simulate", "--json", "--timeline", str(png), "--policy", "fair"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["dedicated_busy_fraction"] == pytest.approx(0.40, abs=0.03)
    assert summary["sliced_busy_fraction"] >= 0.70
    assert summary["policy"] == "fair"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulate_reads_jobs_from_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--jobs", str(EXAMPLES / "jobs.yaml"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert [job["name"] for job in summary["jobs"]] == ["grpo-7b", "dpo-1b"]


def test_simulate_refuses_a_bad_jobs_file_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "jobs.yaml"
    bad.write_text(
        yaml.safe_dump(
            {
                "group": {"gpu_memory_gib": 80},
                "jobs": [{"name": "a", "phases": [{"name": "x", "kind": "gpu", "seconds": -1}]}],
            }
        )
    )
    assert main(["simulate", "--jobs", str(bad)]) == 2
    assert "phase 'x' seconds must be positive" in capsys.readouterr().out


def test_plan_exits_0_when_every_group_fits(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(EXAMPLES / "plan.yaml")]) == 0
    out = capsys.readouterr().out
    assert "group rl: fits" in out
    assert "worst switch:" in out


def test_plan_exits_1_with_the_reason_when_a_group_does_not_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = yaml.safe_load((EXAMPLES / "plan.yaml").read_text())
    data["nodes"][0]["host_memory_gib"] = 256
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["plan", str(path)]) == 1
    out = capsys.readouterr().out
    assert "DOES NOT FIT" in out
    assert "reason: node node-a: parking every job of the group: host memory exhausted" in out
    assert main(["plan", str(path), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["fits"] is False


SAVED = """\
# HELP rlslice_scheduler_busy_fraction Fraction of the last 60 s each group was held
# TYPE rlslice_scheduler_busy_fraction gauge
rlslice_scheduler_busy_fraction{group="idle"} 0.35
rlslice_scheduler_busy_fraction{group="hot"} 0.99
rlslice_scheduler_busy_fraction{group="fine"} 0.8
# HELP rlslice_scheduler_queue_depth Waiters per group
# TYPE rlslice_scheduler_queue_depth gauge
rlslice_scheduler_queue_depth{group="idle"} 0.0
rlslice_scheduler_queue_depth{group="hot"} 3.0
rlslice_scheduler_queue_depth{group="fine"} 0.0
# HELP rlslice_scheduler_acquire_wait_seconds Seconds from Acquire to grant
# TYPE rlslice_scheduler_acquire_wait_seconds histogram
rlslice_scheduler_acquire_wait_seconds_bucket{le="1.0"} 2.0
rlslice_scheduler_acquire_wait_seconds_bucket{le="+Inf"} 10.0
rlslice_scheduler_acquire_wait_seconds_count 10.0
rlslice_scheduler_acquire_wait_seconds_sum 450.0
# HELP rlslice_scheduler_switch_seconds Seconds a switch took (snapshots and restore)
# TYPE rlslice_scheduler_switch_seconds histogram
rlslice_scheduler_switch_seconds_bucket{le="+Inf"} 4.0
rlslice_scheduler_switch_seconds_count 4.0
rlslice_scheduler_switch_seconds_sum 60.0
# HELP rlslice_scheduler_moved_bytes Device bytes moved by switches
# TYPE rlslice_scheduler_moved_bytes counter
rlslice_scheduler_moved_bytes_total 6.0e10
# HELP rlslice_scheduler_switches Switches by outcome (done, failed, faulted)
# TYPE rlslice_scheduler_switches counter
rlslice_scheduler_switches_total{group="hot",outcome="done"} 3.0
rlslice_scheduler_switches_total{group="hot",outcome="failed"} 1.0
rlslice_scheduler_switches_total{group="fine",outcome="done"} 5.0
"""


def test_saved_metrics_are_grouped_by_their_group_label() -> None:
    groups = parse_scheduler_metrics(SAVED)
    assert set(groups) == {"idle", "hot", "fine", ALL_GROUPS}
    assert groups["hot"].queue_depth == 3
    assert groups["hot"].switches_by_outcome == {"done": 3, "failed": 1}
    assert groups[ALL_GROUPS].mean_acquire_wait_s == 45
    assert groups[ALL_GROUPS].mean_switch_s == 15


def test_each_group_gets_its_own_hypotheses() -> None:
    found = diagnose_scheduler_metrics(SAVED)
    assert found["fine"] == [FALLBACK]
    assert len(found["idle"]) == 1
    assert found["idle"][0].startswith("group idle is busy 35% of the time")
    assert found["hot"][0] == "group hot is saturated with 3 waiter(s): move a job to another group"
    assert found["hot"][1].startswith("switches in group hot did not complete (1 failed)")
    wide = found[ALL_GROUPS]
    assert wide[0].startswith("acquires in the scheduler wait 45.0 s on average")
    assert wide[1].startswith("switches in the scheduler take 15.0 s on average")
    assert wide[2].startswith("switches in the scheduler move state at 1.00 GB/s")


def test_diagnose_reads_a_saved_metrics_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "metrics.txt"
    path.write_text(SAVED)
    assert main(["diagnose", str(path)]) == 0
    out = capsys.readouterr().out
    assert "group hot:\n  - group hot is saturated" in out
    assert "scheduler-wide:" in out
    assert main(["diagnose", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fine"] == [FALLBACK]


def test_diagnose_reads_a_live_metrics_endpoint(capsys: pytest.CaptureFixture[str]) -> None:
    from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

    registry = CollectorRegistry()
    Gauge("rlslice_scheduler_busy_fraction", "busy", ["group"], registry=registry).labels("g1").set(
        0.2
    )
    Counter("rlslice_scheduler_switches", "s", ["group", "outcome"], registry=registry).labels(
        "g1", "faulted"
    ).inc(2)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        assert main(["diagnose", url, "--json"]) == 0
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    found = json.loads(capsys.readouterr().out)
    assert found["g1"][0].startswith("group g1 is busy 20% of the time")
    assert found["g1"][1].startswith("switches in group g1 did not complete (2 faulted)")


def test_diagnose_says_so_when_the_source_has_no_rlslice_metrics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "other.txt"
    path.write_text("# TYPE other gauge\nother 1.0\n")
    assert main(["diagnose", str(path)]) == 2
    assert "no rlslice_scheduler_* metrics" in capsys.readouterr().out
    assert main(["diagnose", str(tmp_path / "missing.txt")]) == 2
