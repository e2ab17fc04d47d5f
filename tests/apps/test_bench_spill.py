"""`rlslice bench spill`, scaled down: the command runs end to end and its JSON holds.

Cases:
- throughput: one JSON object with both ratios, the bytes read back identical;
- `--oversubscribe`: 4 jobs over 3x the budget, every job >= 2 turns, bytes identical,
  parked host bytes never above the budget, and spills and fills happened.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def bench(*args: str, tmp_path: Path) -> dict[str, object]:
    env = dict(os.environ, PYTHONSAFEPATH="1")
    command = [sys.executable, "-m", "rlslice.apps", "bench", "spill", "--json", *args]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path
    )
    assert result.stdout, result.stderr
    data: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return data


def test_the_throughput_bench_prints_both_ratios_for_identical_bytes(tmp_path: Path) -> None:
    data = bench(
        "--size", "24MiB", "--repeats", "1", "--dir", str(tmp_path / "d"), tmp_path=tmp_path
    )
    assert data["identical"] is True
    assert data["size_bytes"] == 24 << 20
    for key in ("write_ratio", "read_ratio", "agent_write_gbps", "plain_read_gbps"):
        assert isinstance(data[key], float)
        assert data[key] > 0


def test_four_oversubscribed_jobs_take_their_turns_within_the_budget(tmp_path: Path) -> None:
    data = bench(
        "--oversubscribe", "--job-size", "6MiB", "--turns", "2", "--dir", str(tmp_path / "d"),
        tmp_path=tmp_path,
    )  # fmt: skip
    assert data["identical"] is True
    assert data["turns_per_job"] == 2
    assert data["parked_over_budget"] == 3.0
    assert isinstance(data["parked_host_peak_bytes"], int)
    assert isinstance(data["host_budget_bytes"], int)
    assert data["parked_host_peak_bytes"] <= data["host_budget_bytes"]
    assert isinstance(data["spilled_bytes"], int)
    assert isinstance(data["filled_bytes"], int)
    assert data["spilled_bytes"] > 0
    assert data["filled_bytes"] > 0
