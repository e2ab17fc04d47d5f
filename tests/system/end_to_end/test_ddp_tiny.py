"""examples/ddp_tiny/compare.py end to end: two real data-parallel jobs of many ranks
(torch.distributed over gloo), alone and then time-sliced through `rlslice up --backend
app`, are bit-identical on every rank, and every rank really moved its state.

Cases (each a subprocess run of compare.py with a few steps):
- one node, 2 ranks per job: every rank's losses and final weights identical to its run
  alone, the ranks of a job agree, the group counted switches, every rank's offloader
  moved bytes, and the agents reported bytes moved in the jobs' grants;
- two nodes (a second `rlslice agent` on loopback, node-b), one rank per node (so the run
  stays as small as the one-node case on a loaded 2-core machine; `compare.py --nodes 2`
  runs 2 per node): the same, with the job's ranks on both nodes.

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

COMPARE = Path(__file__).resolve().parents[3] / "examples" / "ddp_tiny" / "compare.py"


@pytest.mark.timeout(200)
@pytest.mark.parametrize(("nodes", "per_node"), [(1, 2), (2, 1)])
def test_time_sliced_jobs_of_many_ranks_are_bit_identical_on_every_rank(
    nodes: int, per_node: int, tmp_path: Path
) -> None:
    out = tmp_path / "compare.json"
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    done = subprocess.run(
        [
            sys.executable,
            str(COMPARE),
            "--nodes",
            str(nodes),
            "--ranks-per-node",
            str(per_node),
            "--steps",
            "4",
            "--json",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=190,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    assert report["ok"] is True
    assert report["nodes"] == nodes
    assert report["switches"] > 0
    assert report["ranks_agree"] is True
    assert all(moved > 0 for moved in report["granted_moved_bytes"].values())
    ranks = report["ranks"]
    assert [(r["job"], r["rank"]) for r in ranks] == [
        (job, rank) for job in ("ddp-a", "ddp-b") for rank in range(nodes * per_node)
    ]
    assert {r["node"] for r in ranks} == ({"node-a"} if nodes == 1 else {"node-a", "node-b"})
    for rank in ranks:
        assert rank["losses_identical"], rank
        assert rank["weights_identical"], rank
        assert rank["offloads"] > 0, rank
        assert rank["moved_bytes"] > 0, rank
    assert "DIFFERENT" not in done.stdout
