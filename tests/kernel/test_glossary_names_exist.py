"""The glossary names what the code names: a renamed class or value fails here, not in a
reader's search.

Cases:
- every `CamelCase` name the glossary quotes is a class (or a type alias) of the package,
  or a message, enum or call of the protocol;
- every `UPPER_CASE` name it quotes is assigned in the package (an enum member);
- the check sees names: the glossary quotes dozens of each kind.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GLOSSARY = (ROOT / "docs" / "glossary.md").read_text()
PROTO = ROOT / "proto" / "rlslice" / "v1alpha1"


def _quoted(pattern: str) -> set[str]:
    return {m for m in re.findall(r"`([^`]+)`", GLOSSARY) if re.fullmatch(pattern, m)}


def _package_trees() -> list[ast.Module]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = set(config["tool"]["setuptools"]["package-dir"].values())
    return [
        ast.parse(path.read_text())
        for folder in sorted(folders)
        for path in sorted((ROOT / folder).rglob("*.py"))
        if not path.name.endswith(("_pb2.py", "_pb2_grpc.py"))
    ]


def _classes_and_assigned() -> tuple[set[str], set[str]]:
    classes: set[str] = set()
    assigned: set[str] = set()
    for tree in _package_trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes.add(node.name)
            elif isinstance(node, ast.Assign):
                assigned.update(t.id for t in node.targets if isinstance(t, ast.Name))
    for proto in PROTO.glob("*.proto"):
        classes.update(re.findall(r"^\s*(?:message|enum|rpc)\s+(\w+)", proto.read_text(), re.M))
    return classes, assigned


def test_every_class_the_glossary_names_exists() -> None:
    classes, assigned = _classes_and_assigned()
    names = _quoted(r"[A-Z][a-z]\w*")
    assert len(names) > 30
    assert names - classes - assigned == set()


def test_every_value_the_glossary_names_exists() -> None:
    _, assigned = _classes_and_assigned()
    values = _quoted(r"[A-Z][A-Z_]+")
    assert len(values) > 10
    assert values - assigned == set()
