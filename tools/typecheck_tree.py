"""Lay the package out as it installs, under `.typecheck/`, for mypy and import-linter.

The source tree maps top-level folders to subpackages (pyproject `package-dir`:
`client/` is `rlslice.client`, `kube_operator/` is `rlslice.operator`, ...). Neither tool
can read that layout in place:

- import-linter builds its graph with grimp, which finds `rlslice` with importlib and then
  walks that one folder (`rlslice/`) for modules; it refuses a subpackage as a root package
  of its own (`NotATopLevelModule`), so the mapped folders would be missing from the graph;
- mypy names a file's module by its folders (`client/x.py` is `client.x`) and does not run
  setuptools' editable finder, the meta-path hook through which the editable install
  resolves `rlslice.client`; the strict editable mode's link tree would do, but it freezes
  the venv's view of the tree at install time (a new module needs a reinstall), for every
  process that imports from the shared venv.

So both read this copy, in the installed shape. It is remade on every run (it is small);
errors name `.typecheck/rlslice/...` paths, which map one-to-one onto the folders of
`package-dir`.
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


if __name__ == "__main__":
    build()
