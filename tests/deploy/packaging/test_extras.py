"""Each extra of pyproject.toml declares what its modules import, and nothing they do not.

The package's modules are parsed with `ast` (every `import`, `from ... import` and
`importlib.import_module("literal")`, at any depth, but not under `if TYPE_CHECKING:`); a
module's third-party imports map to distributions through the development venv's metadata
(it has every extra installed). `OWNERS` says which extras are installed when a module
runs: one or more alternatives (the Kubernetes adapter runs in the scheduler *or* the agent;
the cuda backend in the agent *and* cuda).

Cases:
- every import of a module is declared by the base install or by each alternative of its
  owners; an optional import (inside `try` that catches ImportError) or a lazy import of an
  optional feature (`FEATURES`) must be declared by some extra, or be the job's own (torch);
- every requirement of every component extra is imported by a module that extra owns
  (nothing declared but unused); `all` names every component extra;
- `rlslice.apps.cli.MODULE_EXTRAS` (the missing-extra message) covers every third-party
  module an extra provides, and each extra it names declares that module;
- `cuda-bindings` is bounded to the 12.x bindings: docs/backends.md supports drivers r570+
  (CUDA 12.8+), and 13.x needs a CUDA 13 driver (r580+).
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import re
import sys
import tomllib
from collections import defaultdict
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from rlslice.apps.cli import COMMANDS, MODULE_EXTRAS

ROOT = Path(__file__).resolve().parents[3]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

Alternatives = tuple[tuple[str, ...], ...]
BASE: Alternatives = ((),)

#: module prefix -> the alternatives of extras installed when it runs (longest prefix wins)
OWNERS: dict[str, Alternatives] = {
    "rlslice": BASE,  # kernel, protocol, adapters, client, integrations: the base install
    "rlslice.adapters.kube": (("scheduler",), ("agent",), ("operator",)),
    "rlslice.adapters.server": (("scheduler",), ("agent",)),
    "rlslice.adapters.tracing": (("tracing",),),
    "rlslice.scheduler": (("scheduler",),),
    "rlslice.snapshot_agent": (("agent",),),
    "rlslice.snapshot_agent.backends.cuda": (("agent", "cuda"),),
    "rlslice.snapshot_agent.backends._nvml": (("agent", "cuda"),),
    "rlslice.operator": (("operator",),),
    "rlslice.planner": (("planner",),),
    "rlslice.testing": (("scheduler", "agent"),),
    "rlslice.apps.demo": (COMMANDS["demo"].extras,),  # its worker, runs, report, policies
    "rlslice.apps.bench": (COMMANDS["bench"].extras,),
    **{cmd.module: (cmd.extras,) for cmd in COMMANDS.values()},
}
#: (module, imported top-level) of a lazy import that only an optional feature reaches
FEATURES: dict[tuple[str, str], str] = {
    # --group-config of `rlslice scheduler` / `rlslice up`
    ("rlslice.config", "yaml"): "scheduler",
    # Kubernetes mode on GPU nodes: host pids of GPU processes from NVML
    ("rlslice.snapshot_agent.kubernetes_mode", "pynvml"): "cuda",
    # `--jobs FILE.yaml`; `--timeline PNG`
    ("rlslice.apps.simulate", "yaml"): "planner",
    ("rlslice.apps.simulate", "matplotlib"): "planner",
    # `--out FILE.png`
    ("rlslice.apps.timeline.command", "matplotlib"): "planner",
    # rich tables where the console extra is installed, plain text otherwise
    ("rlslice.apps.status", "rich"): "console",
}
#: brought by the job itself (the `app` backend's offloaders, the swap benchmark)
JOBS_OWN = {"torch", "torch_memory_saver"}
#: extras that pull frameworks for recipes, not imports of the package
FRAMEWORK_EXTRAS = {"ray", "trl"}
_OPTIONAL_ERRORS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert match, requirement
    return _canonical(match.group(1))


def _declared() -> dict[str, set[str]]:
    """extra ("" for the base install) -> canonical distribution names."""
    project = PYPROJECT["project"]
    declared = {"": {_requirement_name(r) for r in project["dependencies"]}}
    for extra, requirements in project["optional-dependencies"].items():
        declared[extra] = {_requirement_name(r) for r in requirements}
    return declared


def _modules() -> Iterator[tuple[str, Path]]:
    """(dotted name, file) of every module the wheel ships."""
    setuptools = PYPROJECT["tool"]["setuptools"]
    dirs: dict[str, str] = setuptools["package-dir"]
    for package in setuptools["packages"]:
        head = max((p for p in dirs if package == p or package.startswith(p + ".")), key=len)
        folder = ROOT / dirs[head] / package[len(head) :].lstrip(".").replace(".", "/")
        for path in sorted(folder.glob("*.py")):
            if path.name.endswith(("_pb2.py", "_pb2_grpc.py")) and "v1alpha1" in package:
                yield f"{package}.{path.stem}", path  # generated: protobuf and grpc only
                continue
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            yield name, path


class _Imports(ast.NodeVisitor):
    """Third-party top-level names a module imports: required, lazy or optional."""

    def __init__(self) -> None:
        self.required: set[str] = set()
        self.lazy: set[str] = set()
        self.optional: set[str] = set()
        self._depth = 0
        self._guarded = 0

    def _add(self, dotted: str) -> None:
        top = dotted.partition(".")[0]
        if top in sys.stdlib_module_names or top in {"rlslice", "__future__"}:
            return
        if self._guarded:
            self.optional.add(top)
        elif self._depth:
            self.lazy.add(top)
        else:
            self.required.add(top)

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        ):
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Try(self, node: ast.Try) -> None:
        caught = set()
        for handler in node.handlers:
            kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
            caught |= {k.id for k in kinds if isinstance(k, ast.Name)}
            caught |= {"BaseException"} if handler.type is None else set()
        guarded = bool(caught & _OPTIONAL_ERRORS)
        self._guarded += guarded
        for child in node.body:
            self.visit(child)
        self._guarded -= guarded
        for child in [*node.handlers, *node.orelse, *node.finalbody]:
            self.visit(child)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0 and node.module:
            self._add(node.module)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        named = isinstance(func, ast.Attribute) and func.attr == "import_module"
        if named and node.args and isinstance(node.args[0], ast.Constant):
            value = node.args[0].value
            if isinstance(value, str):
                self._add(value)
        self.generic_visit(node)


def _imports() -> dict[str, _Imports]:
    found = {}
    for name, path in _modules():
        visitor = _Imports()
        visitor.visit(ast.parse(path.read_text(), str(path)))
        found[name] = visitor
    return found


def _owners(module: str) -> Alternatives:
    head = max((p for p in OWNERS if module == p or module.startswith(p + ".")), key=len)
    return OWNERS[head]


@functools.cache
def _installed() -> Mapping[str, list[str]]:
    return importlib.metadata.packages_distributions()


def _distributions(top: str) -> set[str]:
    mapping = _installed()
    assert top in mapping, (
        f"{top} is not installed in the development venv: declare it in an extra (and the "
        "dev group), or name it in JOBS_OWN when the job itself brings it"
    )
    return {_canonical(d) for d in mapping[top]}


IMPORTS = _imports()
DECLARED = _declared()
COMPONENT_EXTRAS = set(DECLARED) - {"", "all"} - FRAMEWORK_EXTRAS


def test_every_module_of_the_wheel_is_parsed() -> None:
    assert "rlslice.scheduler.server" in IMPORTS
    assert "rlslice.apps.cli" in IMPORTS
    assert {"cuda", "pynvml"} <= IMPORTS["rlslice.snapshot_agent.backends.cuda"].required | (
        IMPORTS["rlslice.snapshot_agent.backends.cuda"].optional
        | IMPORTS["rlslice.snapshot_agent.backends.cuda"].lazy
        | IMPORTS["rlslice.snapshot_agent.backends._nvml"].optional
    )


def test_every_import_is_declared_where_its_module_runs() -> None:
    missing = []
    for module, found in IMPORTS.items():
        for top in sorted(found.required | found.lazy):
            if top in JOBS_OWN:
                continue
            feature = FEATURES.get((module, top)) if top in found.lazy else None
            for alternative in [(feature,)] if feature else _owners(module):
                have = DECLARED[""].union(*(DECLARED[extra] for extra in alternative))
                if not _distributions(top) & have:
                    missing.append(f"{module} imports {top}: not in {alternative or 'base'}")
    assert not missing, "\n".join(missing)


def test_every_optional_import_is_declared_by_some_extra() -> None:
    everything = set().union(*DECLARED.values())
    missing = [
        f"{module} may import {top}"
        for module, found in IMPORTS.items()
        for top in sorted(found.optional - JOBS_OWN)
        if not _distributions(top) & everything
    ]
    assert not missing, "\n".join(missing)


def test_every_requirement_of_a_component_extra_is_imported() -> None:
    # An import of a module that runs with several extras (demo: scheduler, agent, planner,
    # console) counts for the one of them that declares it; where several do, for none.
    used: dict[str, set[str]] = defaultdict(set)
    for module, found in IMPORTS.items():
        for alternative in _owners(module):
            for top in found.required | found.lazy | found.optional:
                if top in JOBS_OWN:
                    continue
                names = _distributions(top)
                declaring = [extra for extra in alternative if names & DECLARED[extra]]
                if len(declaring) == 1:
                    used[declaring[0]] |= names
        for (feature_module, top), extra in FEATURES.items():
            if feature_module == module:
                used[extra] |= _distributions(top)
    unused = [
        f"{extra}: {name} is declared but nothing it runs imports it"
        for extra in sorted(COMPONENT_EXTRAS)
        for name in sorted(DECLARED[extra] - used[extra])
    ]
    assert not unused, "\n".join(unused)


def test_all_names_every_component_extra() -> None:
    (requirement,) = PYPROJECT["project"]["optional-dependencies"]["all"]
    match = re.fullmatch(r"rlslice\[([a-z,-]+)\]", requirement)
    assert match, requirement
    assert set(match.group(1).split(",")) == COMPONENT_EXTRAS


def test_the_missing_extra_table_of_the_cli_matches_pyproject() -> None:
    provided = {
        top
        for found in IMPORTS.values()
        for top in found.required | found.lazy | found.optional
        if top not in JOBS_OWN and not _distributions(top) & DECLARED[""]
    }
    assert provided <= set(MODULE_EXTRAS), sorted(provided - set(MODULE_EXTRAS))
    for top, extras in MODULE_EXTRAS.items():
        if top not in provided:
            continue  # a name kept for a module not imported today
        for extra in extras:
            assert _distributions(top) & DECLARED[extra], f"{extra} does not install {top}"


@pytest.mark.parametrize("extra", sorted({e for c in COMMANDS.values() for e in c.extras}))
def test_every_extra_a_command_names_exists(extra: str) -> None:
    assert extra in DECLARED


def test_cuda_bindings_are_the_12x_bindings_for_drivers_r570_and_newer() -> None:
    (requirement,) = [
        r
        for r in PYPROJECT["project"]["optional-dependencies"]["cuda"]
        if _requirement_name(r) == "cuda-bindings"
    ]
    assert re.sub(r"\s", "", requirement.split(";")[0]) == "cuda-bindings>=12.8,<13"
    backends = (ROOT / "docs" / "backends.md").read_text()
    assert "r570+ (CUDA 12.8+)" in backends
