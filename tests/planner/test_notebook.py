"""The notebook of seed 001 runs unchanged (bar its imports) against rlslice.planner.

Cases:
- the fixture is exactly the seed's code after the declared rewrites (when the seed is here);
- every code cell runs, its own asserts pass, and the figures it prints are the course's;
- the rewrite refuses a notebook whose imports changed shape.

Why a fixture: CI clones the repository with ../shared beside it today, but a test
that depends on a sibling folder breaks the day it moves; the fixture keeps the run
deterministic, and the drift test ties it back to the seed wherever the seed exists.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import runpy
import sys
import warnings
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("planner_notebook_helpers", HERE / "_notebook.py")
assert _spec
assert _spec.loader
notebook = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(notebook)


def test_the_fixture_is_the_seed_notebook_after_the_declared_rewrites() -> None:
    source = notebook.seed_file()
    if source is None:
        pytest.skip(f"seed 001 is not beside the repository ({notebook.SEED_DIR})")
    expected = notebook.rewrite(notebook.seed_code(source.read_text(encoding="utf-8")))
    assert notebook.FIXTURE.read_text(encoding="utf-8") == expected


def test_a_notebook_whose_imports_changed_is_refused() -> None:
    with pytest.raises(AssertionError, match=r"IPython\.display"):
        notebook.rewrite("from module_12_pipeline_sim import (\n")


# pandas is in the dev group; without it this test fails at the notebook's import, loudly.
def test_every_notebook_cell_runs_and_its_asserts_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RL_LLM_PROFILE", "smoke")
    monkeypatch.setattr(sys, "path", list(sys.path))  # the notebook appends to it
    out = io.StringIO()
    with contextlib.redirect_stdout(out), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*non-interactive.*")
        namespace = runpy.run_path(str(notebook.FIXTURE), run_name="notebook")
    plt.close("all")
    printed = out.getvalue()

    assert "KV-cache teaching configuration: 16.00 GiB" in printed
    assert "Peak phase: training 50.00 GiB" in printed
    assert "First-order Young interval, seconds: 3600.0" in printed
    assert "Valid record errors: []" in printed
    assert namespace["drill"].exact_match
    assert not namespace["drill"].broken_match
    assert namespace["DURATION"] == 120.0
    results = namespace["results"]
    assert set(results) == {
        "sequential",
        "bounded async / sync every update",
        "deeper async / sync every 3 updates",
    }
    memory = namespace["memory_rows"]
    assert [row["logical bytes"] for row in memory] == [
        84_000_000_000,
        112_000_000_000,
        15_120_000_000,
    ]
