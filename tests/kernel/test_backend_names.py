"""Backend names come from one rule: the shipped backends plus every installed plug-in.

Cases:
- the shipped names (`sim`, `cuda`, `cuda-checkpoint`, `app`) validate for a group, a job
  and an agent;
- a plug-in installed as a real distribution (a dist-info with an entry point in
  `rlslice.backends`) validates everywhere too, without any change to rlslice;
- an unknown name is refused with one message naming the field and every choice.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from rlslice.config import BACKENDS, GroupSpec, JobSpec, backend_names
from rlslice.snapshot_agent.settings import AgentSettings


@pytest.fixture
def plugin(tmp_path: Path) -> Iterator[str]:
    info = tmp_path / "rlslice_tpu_backend-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: rlslice-tpu-backend\nVersion: 0.1\n"
    )
    (info / "entry_points.txt").write_text("[rlslice.backends]\ntpu = rlslice_tpu:TpuBackend\n")
    sys.path.insert(0, str(tmp_path))
    backend_names.cache_clear()
    try:
        yield "tpu"
    finally:
        sys.path.remove(str(tmp_path))
        backend_names.cache_clear()


def test_the_shipped_backends_validate_everywhere() -> None:
    for name in BACKENDS:
        assert GroupSpec(name="g", backend=name).backend == name
        assert JobSpec(name="j", backend=name).backend == name
        assert AgentSettings(backend=name).backend == name


def test_an_installed_plugin_backend_validates_everywhere(plugin: str) -> None:
    assert plugin in backend_names()
    assert GroupSpec(name="g", backend=plugin).backend == plugin
    assert JobSpec(name="j", backend=plugin).backend == plugin
    assert AgentSettings(backend=plugin).backend == plugin


def test_an_unknown_backend_is_refused_naming_the_field_and_the_choices(plugin: str) -> None:
    expected = r"backend: 'tpux' is not one of sim, cuda, cuda-checkpoint, app, tpu"
    with pytest.raises(ValidationError, match=expected):
        GroupSpec(name="g", backend="tpux")
    with pytest.raises(ValidationError, match=expected):
        AgentSettings(backend="tpux")
