"""A pure module loads alone: importing it in a fresh interpreter brings no grpc, asyncio
or protobuf.

The import contracts check what a module's own source imports; this checks what Python
actually loads, parent packages' `__init__` included (a package that imports its server
on import drags grpc into every pure module below it).

Cases:
- every source module of pyproject's "Pure cores" contract, and every module below the
  packages among them, then the other pure modules named here (the packages `rlslice`,
  `rlslice.scheduler` and `rlslice.snapshot_agent` themselves among them), load in one
  fresh interpreter; after each import none of `grpc`, `asyncio`, `google.protobuf` is loaded;
- the modules imported are the ones listed (a typo or a moved module fails the test
  instead of passing it unseen).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

FORBIDDEN = ("grpc", "asyncio", "google.protobuf")

# Pure modules outside the contract, each loaded on its own (a package here is not walked):
# they may read the clock or the files, but they load without the wire or an event loop.
OTHER_PURE = (
    "rlslice",
    "rlslice.scheduler",
    "rlslice.snapshot_agent",
    "rlslice.snapshot_agent.backends.base",
    "rlslice.snapshot_agent.memguard",
    "rlslice.snapshot_agent.spill",
)

# Imports each named module in turn (and, for a package in the first list, every module
# below it) and prints, as JSON, the modules imported and, for the first import that loaded a forbidden
# module, which ones it loaded.
PROBE = textwrap.dedent(
    """
    import importlib, json, pkgutil, sys

    walked, single, forbidden = (json.loads(arg) for arg in sys.argv[1:])
    imported, pulled = [], {}

    def load(name):
        module = importlib.import_module(name)
        imported.append(name)
        loaded = [f for f in forbidden if f in sys.modules]
        if loaded and not pulled:
            pulled[name] = loaded
        return module

    for name in walked:
        module = load(name)
        for info in pkgutil.walk_packages(getattr(module, "__path__", []), name + "."):
            if info.name not in imported:
                load(info.name)
    for name in single:
        load(name)
    print(json.dumps({"imported": imported, "pulled": pulled}))
    """
)


def _pure_sources() -> list[str]:
    (contract,) = [
        c
        for c in PYPROJECT["tool"]["importlinter"]["contracts"]
        if c["type"] == "forbidden" and c["name"].startswith("Pure cores")
    ]
    return list(contract["source_modules"])


def _probe(walked: list[str], single: list[str], tmp_path: Path) -> dict[str, object]:
    # -P: the repository root (or here, the test's folder) never lands on sys.path.
    result = subprocess.run(
        [sys.executable, "-P", "-c", PROBE, *map(json.dumps, (walked, single, FORBIDDEN))],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
        timeout=60,
    )
    probed: dict[str, object] = json.loads(result.stdout)
    return probed


def test_every_pure_module_loads_without_grpc_asyncio_or_protobuf(tmp_path: Path) -> None:
    names = [*_pure_sources(), *OTHER_PURE]
    probed = _probe(_pure_sources(), list(OTHER_PURE), tmp_path)
    assert probed["pulled"] == {}, f"these imports loaded {FORBIDDEN}: {probed['pulled']}"
    imported = probed["imported"]
    assert isinstance(imported, list)
    assert set(names) <= set(imported)
    # The packages among them were walked: the scheduler's core alone has a dozen modules.
    assert sum(1 for m in imported if m.startswith("rlslice.scheduler.core.")) >= 10


def test_the_probe_sees_a_module_that_loads_grpc(tmp_path: Path) -> None:
    probed = _probe(["rlslice.units"], ["rlslice.v1alpha1.scheduler_pb2_grpc"], tmp_path)
    pulled = probed["pulled"]
    assert isinstance(pulled, dict)
    assert list(pulled) == ["rlslice.v1alpha1.scheduler_pb2_grpc"]
    assert {"grpc", "google.protobuf"} <= set(pulled["rlslice.v1alpha1.scheduler_pb2_grpc"])
