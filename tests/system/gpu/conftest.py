"""Fixtures for the GPU backends' tests. The fakes (driver boundary only) live in fakes.py,
loaded here as the module `rlslice_gpu_fakes`; tests marked `gpu` skip themselves unless
cuda.bindings reaches a real driver."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "rlslice_gpu_fakes", Path(__file__).with_name("fakes.py")
)
assert _spec is not None
assert _spec.loader is not None
fakes = importlib.util.module_from_spec(_spec)
sys.modules["rlslice_gpu_fakes"] = fakes
_spec.loader.exec_module(fakes)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("gpu") and (reason := fakes.no_gpu_reason()):
            item.add_marker(pytest.mark.skip(reason=reason))
