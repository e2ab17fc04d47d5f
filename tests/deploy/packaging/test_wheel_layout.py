"""The wheel lays the source folders out as the import paths `package-dir` names.

Cases:
- every Python file of every mapped folder is in the wheel under its import path
  (`kube_operator/handlers.py` as `rlslice/operator/handlers.py`), `__init__.py` included;
- nothing lands at the wheel's top level but `rlslice/` and its metadata: no
  `kube_operator/`, no `operator/` that could shadow the standard library.
"""

from __future__ import annotations

import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGE_DIR: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"][
    "setuptools"
]["package-dir"]


def _expected() -> set[str]:
    """Each mapped folder's Python files under the import path (a subpackage missing from
    pyproject's `packages` would be missing from the wheel)."""
    names = set()
    for package, folder in PACKAGE_DIR.items():
        source = ROOT / folder
        for path in source.rglob("*.py"):
            relative = path.relative_to(source)
            if "__pycache__" not in relative.parts:
                names.add("/".join([*package.split("."), *relative.parts]))
    return names


def test_every_mapped_file_is_in_the_wheel_under_its_import_path(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        inside = set(archive.namelist())
    assert "rlslice/operator/__init__.py" in inside
    assert "rlslice/operator/handlers.py" in inside
    assert sorted(_expected() - inside) == []


def test_only_rlslice_is_at_the_wheels_top_level(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/", 1)[0] for name in archive.namelist()}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"rlslice"}
