"""The rlslice wheel, built from a copy of the tree (so no build folder or egg-info lands in
the checkout other processes are reading), once per session."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
#: what the wheel is built from: pyproject's package-dir folders, the readme, pyproject
SOURCES = (
    "pyproject.toml",
    "README.md",
    "rlslice",
    "proto",
    "client",
    "scheduler",
    "snapshot_agent",
    "kube_operator",
    "planner",
    "integrations",
    "apps",
    "testing",
)
PIP_WHEEL = (sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation")
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")


def build_wheel(workdir: Path) -> Path:
    """The wheel of the working tree, built with the running interpreter's setuptools."""
    source = workdir / "src"
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=_IGNORE)
        else:
            source.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, source / name)
    out = workdir / "wheel"
    subprocess.run(
        [*PIP_WHEEL, str(source), "-w", str(out)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    (wheel,) = out.glob("rlslice-*.whl")
    return wheel


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of the working tree."""
    return build_wheel(tmp_path_factory.mktemp("wheel"))
