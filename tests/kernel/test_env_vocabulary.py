"""Every job-side `RLSLICE_*` variable is named once, in `rlslice.env`.

Cases:
- no module of the package spells one of `rlslice.env`'s names as a string literal (they
  refer to the constant), so a rename cannot leave a reader behind;
- every name `rlslice.env` defines starts with `RLSLICE_` and is distinct;
- docs/client.md's table names every one of them.

So the client, `rlslice run`, the sim client, the demo and the operator's pod mutation
cannot disagree on a name: they all import it.
"""

from __future__ import annotations

import ast
from pathlib import Path

from rlslice import env

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_FOLDERS = (
    "rlslice",
    "client",
    "scheduler",
    "snapshot_agent",
    "kube_operator",
    "planner",
    "integrations",
    "apps",
    "testing",
)


def _names() -> dict[str, str]:
    return {
        value: name
        for name, value in vars(env).items()
        if name.isupper() and isinstance(value, str) and value.startswith("RLSLICE_")
    }


def test_the_vocabulary_names_are_distinct_and_prefixed() -> None:
    constants = [
        value
        for name, value in vars(env).items()
        if name.isupper() and isinstance(value, str) and value.startswith("RLSLICE_")
    ]
    assert len(constants) >= 14
    assert len(set(constants)) == len(constants)


def test_no_module_spells_a_job_side_variable_as_a_literal() -> None:
    names = _names()
    spelled = []
    for folder in PACKAGE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == ROOT / "rlslice" / "env.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and node.value in names:
                    where = path.relative_to(ROOT)
                    spelled.append(
                        f"{where}:{node.lineno}: {node.value} (use env.{names[node.value]})"
                    )
    assert spelled == []


def test_the_client_guide_names_every_variable() -> None:
    guide = (ROOT / "docs" / "client.md").read_text()
    assert [name for name in _names() if f"`{name}`" not in guide] == []
