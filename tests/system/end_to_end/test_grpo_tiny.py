"""examples/grpo_tiny/compare.py end to end: two real GRPO jobs, alone and then time-sliced
through `rlslice up --backend app`, are bit-identical, and the switches really moved state.

Cases (each a subprocess run of compare.py with a few steps):
- sync mode: per-step losses, rewards and final weights identical for both jobs; the group
  counted switches; the jobs' grants report restores and moved bytes;
- async mode (bounded staleness, sampler thread overlapping the train step): the same.

torch is required: with RLSLICE_REQUIRE_TORCH=1 (CI) a missing torch fails instead of skipping.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

if os.environ.get("RLSLICE_REQUIRE_TORCH") == "1":
    import torch  # noqa: F401
else:
    pytest.importorskip("torch")

COMPARE = Path(__file__).resolve().parents[3] / "examples" / "grpo_tiny" / "compare.py"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_time_sliced_grpo_jobs_are_bit_identical_to_their_runs_alone(
    mode: str, tmp_path: Path
) -> None:
    out = tmp_path / "compare.json"
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    done = subprocess.run(
        [sys.executable, str(COMPARE), "--mode", mode, "--steps", "6", "--json", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    assert report["ok"] is True
    assert report["mode"] == mode
    assert report["switches"] > 0
    assert report["moved_bytes"] > 0
    assert [job["job"] for job in report["jobs"]] == ["grpo-a", "grpo-b"]
    for job in report["jobs"]:
        assert job["steps"] == 6
        assert job["losses_identical"], job
        assert job["rewards_identical"], job
        assert job["weights_identical"], job
        assert job["restored_grants"] > 0, job
        assert job["moved_bytes"] > 0, job
    assert "identical" in done.stdout
    assert "DIFFERENT" not in done.stdout
