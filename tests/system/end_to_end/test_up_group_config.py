"""`rlslice up --group-config FILE` creates the groups the file lists, as
`rlslice scheduler --group-config` does.

Cases:
- the real command, started with examples/grpo_tiny/group.yaml, serves that group with its
  backend, headroom and lease (read back over gRPC) before any job registers;
- that file says exactly what examples/grpo_tiny/compare.py puts, so the two ways of
  running the example cannot drift apart;
- a file of a bad spec is refused naming the field.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from rlslice.adapters.wire import group_spec_from_proto
from rlslice.config import GroupSpec, load_group_config
from rlslice.testing import free_port
from rlslice.v1alpha1 import scheduler_pb2, scheduler_pb2_grpc

GROUP_YAML = Path(__file__).resolve().parents[3] / "examples" / "grpo_tiny" / "group.yaml"
ENV = {**os.environ, "PYTHONSAFEPATH": "1"}


def test_up_creates_the_configured_groups_before_any_job_registers(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    argv = [
        sys.executable, "-m", "rlslice.apps", "--log-level", "WARNING", "up",
        "--address", address, "--store", str(tmp_path / "s.db"),
        "--socket", str(tmp_path / "agent.sock"), "--state-dir", str(tmp_path / "agent"),
        "--sim-root", str(tmp_path / "sim"), "--host-reserve-bytes", "0",
        "--backend", "app", "--group-config", str(GROUP_YAML),
    ]  # fmt: skip
    process = subprocess.Popen(argv, env=ENV, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        with grpc.insecure_channel(address) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            while True:
                assert process.poll() is None, "rlslice up exited"
                try:
                    status = stub.GetGroup(
                        scheduler_pb2.GetGroupRequest(group="grpo-tiny"), timeout=5
                    )
                    break
                except grpc.RpcError as error:
                    if time.monotonic() > deadline:
                        raise AssertionError(f"no group grpo-tiny: {error}") from None
                    time.sleep(0.1)
        spec = group_spec_from_proto(status.spec)
        assert (spec.backend, spec.headroom_bytes, spec.lease_seconds) == ("app", 1 << 50, 60)
        assert list(status.jobs) == []
    finally:
        process.terminate()
        process.wait(timeout=20)


def test_the_example_group_file_says_what_compare_puts() -> None:
    sys.path.insert(0, str(GROUP_YAML.parent))
    try:
        import compare
    finally:
        sys.path.remove(str(GROUP_YAML.parent))
    (spec,) = load_group_config(GROUP_YAML)
    assert spec == GroupSpec(
        name=compare.GROUP, backend="app", headroom_bytes=compare.HEADROOM_BYTES, lease_seconds=60
    )


def test_a_bad_group_file_is_refused_naming_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "groups.yaml"
    bad.write_text("groups:\n  - name: g\n    headroom_bytes: -1\n")
    with pytest.raises(ValueError) as raised:
        load_group_config(bad)
    assert str(raised.value) == (
        f"{bad}: groups[0].headroom_bytes: Input should be greater than or equal to 0"
    )
