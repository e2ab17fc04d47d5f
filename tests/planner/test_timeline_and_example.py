"""The timeline PNG over plain data, and the module-12 example script end to end.

Cases: plot_timeline draws plain (job, start, end, kind) tuples with switch markers and
unknown kinds; refuses malformed lanes naming the index; imports matplotlib only when
called; the example reproduces the notebook's tables and figures in a short run.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlslice.planner import SwitchMarker, plot_timeline

PNG = b"\x89PNG\r\n\x1a\n"
REPO = Path(__file__).resolve().parents[2]


def test_plain_tuples_and_switch_markers_become_a_png(tmp_path: Path) -> None:
    lanes = [
        ("job-a", 0.0, 10.0, "gpu:rollout"),
        ("job-a", 10.0, 30.0, "cpu"),
        ("job-b", 0.0, 10.5, "wait"),
        ("job-b", 10.5, 20.0, "gpu"),
        ("job-b", 20.0, 25.0, "checkpoint"),  # a kind without a fixed colour
    ]
    path = plot_timeline(
        lanes,
        tmp_path / "sub" / "t.png",
        switches=[(10.0, 10.5), SwitchMarker(20.0, 20.2)],
        title="two jobs",
    )
    assert path.read_bytes()[:8] == PNG


@pytest.mark.parametrize(
    ("lanes", "message"),
    [
        ([("a", 0.0, 1.0)], r"lanes\[0\] must be"),
        ([("a", 2.0, 1.0, "gpu")], r"lanes\[0\] must have numeric start <= end"),
        ([("a", True, 1.0, "gpu")], r"lanes\[0\] start and end must be numbers"),
        ([(1, 0.0, 1.0, "gpu")], r"lanes\[0\] job and kind must be strings"),
    ],
)
def test_malformed_lanes_are_refused_naming_the_index(
    tmp_path: Path, lanes: list[tuple[object, ...]], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        plot_timeline(lanes, tmp_path / "t.png")  # type: ignore[arg-type]


def test_the_example_reproduces_the_notebook_tables_and_figures(tmp_path: Path) -> None:
    out = tmp_path / "m12"
    env = {**os.environ, "PYTHONSAFEPATH": "1", "MPLBACKEND": "Agg"}
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples/module12/reproduce.py"),
            "--out",
            str(out),
            "--duration",
            "30",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for name in ("queue_tokens.png", "lag_vs_ess.png", "article_timeline.png"):
        assert (out / name).read_bytes()[:8] == PNG, name
    with (out / "memory_profiles.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["logical bytes"]) for r in rows] == [
        84_000_000_000,
        112_000_000_000,
        15_120_000_000,
    ]
    with (out / "pipeline.csv").open() as handle:
        (pipeline,) = csv.DictReader(handle)
    assert float(pipeline["sequential s"]) == 800.0
    assert float(pipeline["pipelined s"]) == 620.0
    assert "Young interval: 3600 s" in done.stdout
