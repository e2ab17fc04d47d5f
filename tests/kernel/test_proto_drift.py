"""The committed protocol stubs are exactly what `make proto` generates from the sources."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "proto" / "rlslice" / "v1alpha1"


def _load_generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("genproto", ROOT / "tools" / "genproto.py")
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(importlib.util.find_spec("grpc_tools") is None, reason="grpcio-tools missing")
def test_committed_stubs_match_a_fresh_generation(tmp_path: Path) -> None:
    generator = _load_generator()
    written = generator.generate(tmp_path)
    assert written, "protoc wrote nothing"
    for fresh in written:
        committed = GENERATED / fresh.name
        assert committed.exists(), f"{fresh.name} is generated but not committed"
        assert committed.read_text() == fresh.read_text(), (
            f"{fresh.name} drifted from its .proto: run `make proto` and commit"
        )


def test_generated_modules_import_under_the_package_name() -> None:
    from rlslice.v1alpha1 import agent_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc

    assert scheduler_pb2.DESCRIPTOR.package == "rlslice.v1alpha1"
    assert hasattr(scheduler_pb2_grpc, "SchedulerServicer")
    assert hasattr(agent_pb2_grpc, "LocalAgentServicer")
    assert "rlslice.v1alpha1.scheduler_pb2" in sys.modules
