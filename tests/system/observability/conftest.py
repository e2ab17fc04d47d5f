"""Fixtures of the observability tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

HERE = Path(__file__).parent


@pytest.fixture(scope="session")
def catalogue() -> ModuleType:
    """`metrics_catalogue.py`, the one list of metric names (tests import by path here)."""
    spec = importlib.util.spec_from_file_location(
        "metrics_catalogue", HERE / "metrics_catalogue.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
