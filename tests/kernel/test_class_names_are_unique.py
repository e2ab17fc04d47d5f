"""One word per concept: no public class name is defined twice in the package.

Two classes with one name (a `JobRecord` in the scheduler and another in the agent) make a
reader, a log line or an import guess which is meant. A private class (leading underscore)
is its module's business and may repeat.

Cases:
- every public class, at any depth, of every folder pyproject maps to a subpackage of
  `rlslice` (the generated protocol code aside) has a name no other class there has;
- the scan sees the package: the folders exist and hold well over a hundred classes.
"""

from __future__ import annotations

import ast
import tomllib
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
GENERATED = "proto/rlslice/v1alpha1"


def _folders() -> list[Path]:
    package_dir: dict[str, str] = PYPROJECT["tool"]["setuptools"]["package-dir"]
    return [ROOT / folder for folder in sorted(set(package_dir.values()) - {GENERATED})]


def _public_classes() -> dict[str, list[str]]:
    """Class name -> the files (and lines) that define it."""
    found: dict[str, list[str]] = defaultdict(list)
    for folder in _folders():
        for path in sorted(folder.rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                    found[node.name].append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_public_class_name_is_defined_twice() -> None:
    twice = {name: where for name, where in _public_classes().items() if len(where) > 1}
    assert twice == {}


def test_the_scan_covers_every_component_folder() -> None:
    folders = {folder.name for folder in _folders()}
    assert {"client", "scheduler", "snapshot_agent", "planner", "rlslice"} <= folders
    assert all(folder.is_dir() for folder in _folders())
    assert len(_public_classes()) > 100
