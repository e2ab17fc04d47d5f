"""Lay the package out as it installs, under `.typecheck/`, for mypy and import-linter.

The source tree maps top-level folders to subpackages (pyproject `package-dir`); type
checkers and import-linter read files from disk by module path, so they need the installed
shape. The copy is remade on every run (it is small); errors name `.typecheck/rlslice/...`
paths, which map one-to-one onto the folders listed below.
"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / ".typecheck"


def build() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_dir: dict[str, str] = config["tool"]["setuptools"]["package-dir"]
    shutil.rmtree(OUT, ignore_errors=True)
    # Longest names last so a subpackage's copy lands inside its parent's.
    for name, folder in sorted(package_dir.items(), key=lambda item: item[0].count(".")):
        target = OUT.joinpath(*name.split("."))
        shutil.copytree(
            ROOT / folder,
            target,
            dirs_exist_ok=True,
            ignore=shutil.ignore_patterns("__pycache__", "*.proto", "*.pyc"),
        )
        if not (target / "__init__.py").exists():
            (target / "__init__.py").write_text("")


if __name__ == "__main__":
    build()
