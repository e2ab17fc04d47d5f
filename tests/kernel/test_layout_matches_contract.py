"""The README's layout table and the import contract say the same thing.

Cases:
- the table's rows, top to bottom, name the same subpackages in the same order as the
  `layers` contract in pyproject.toml (the kernel's private modules all sit in its last row);
- every folder the table names maps to that import in pyproject's `package-dir`;
- the contract is exhaustive: every subpackage of `rlslice` is in a layer.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _layers() -> list[set[str]]:
    # The package-level contract; the components' own layers contracts sit beside it.
    (contract,) = [
        c
        for c in PYPROJECT["tool"]["importlinter"]["contracts"]
        if c["type"] == "layers" and c["containers"] == ["rlslice"]
    ]
    assert contract["exhaustive"] is True
    return [set(re.split(r"\s*[|:]\s*", layer)) for layer in contract["layers"]]


def _table() -> list[tuple[list[str], list[str]]]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[2].startswith("`rlslice"):
            folders = re.findall(r"`([^`]+/)`", cells[1])
            imports = re.findall(r"`(rlslice[a-z0-9_.]*)`", cells[2])
            rows.append((folders, imports))
    return rows


def test_the_table_rows_are_the_contract_layers_in_order() -> None:
    layers = _layers()
    table = _table()
    # The kernel row stands for the contract's last rows (the root package's own modules).
    kernel_rows = [
        layer
        for layer in layers
        if all(n.startswith("_") or n in {"config", "env", "units"} for n in layer)
    ]
    assert table[-1][1] == ["rlslice"]
    upper = layers[: len(layers) - len(kernel_rows)]
    named = [{name.removeprefix("rlslice.") for name in imports} for _, imports in table[:-1]]
    assert named == upper


def test_every_folder_in_the_table_maps_to_its_import() -> None:
    package_dir = PYPROJECT["tool"]["setuptools"]["package-dir"]
    for folders, imports in _table():
        for folder, name in zip(folders, imports, strict=True):
            # pyproject maps the name to a folder; a kernel sub-package (rlslice/adapters/)
            # lies where its name says. The table names the top folder (proto/ for
            # proto/rlslice/v1alpha1).
            mapped = package_dir.get(name) or name.replace(".", "/")
            assert (mapped + "/").startswith(folder), (folder, name, mapped)
