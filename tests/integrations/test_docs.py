"""docs/integrations.md stays true to the API: every Python block compiles, and the blocks
marked `<!-- doc-test: run -->` (they need only rlslice) run in a real process against a
real scheduler.

Cases: the page has Python blocks and runnable ones; each block compiles; each runnable
block exits 0 and prints what it should.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlslice.testing import SchedulerForTests

PAGE = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"
BLOCK = re.compile(r"(<!-- doc-test: run -->\n)?```python\n(.*?)```", re.DOTALL)


def blocks() -> list[tuple[bool, str]]:
    return [(bool(m.group(1)), m.group(2)) for m in BLOCK.finditer(PAGE.read_text())]


def test_the_page_has_python_blocks_and_runnable_ones() -> None:
    found = blocks()
    assert len(found) >= 8
    assert sum(run for run, _ in found) >= 2


@pytest.mark.parametrize(("index", "code"), [(i, c) for i, (_, c) in enumerate(blocks())])
def test_every_python_block_compiles(index: int, code: str) -> None:
    compile(code, f"{PAGE.name}[block {index}]", "exec")


RUNNABLE = [c for run, c in blocks() if run]
EXPECTED = [["['2+2= ...']", "grpo-doc"], ["['sampler-pool', 'trainer-pool']"]]


@pytest.mark.parametrize(("code", "expected"), list(zip(RUNNABLE, EXPECTED, strict=True)))
def test_runnable_blocks_run_against_a_real_scheduler(
    sched: SchedulerForTests, tmp_path: Path, code: str, expected: list[str]
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLSLICE_")}
    env |= {"RLSLICE_SCHEDULER": sched.address, "RLSLICE_JOB": "grpo-doc"}
    env |= {"RLSLICE_GROUP": "gpus", "PYTHONSAFEPATH": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[: len(expected)] == expected
    assert sched.group("gpus").holder == ""
