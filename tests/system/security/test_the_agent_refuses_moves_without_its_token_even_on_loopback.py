"""The Agent service is never open, not even on 127.0.0.1: loopback is no trust boundary
between the users of a host.

A real agent on loopback with no token configured takes the node-local one (a 0600 file
of its user, `rlslice.adapters.auth.local_agent_token`). A Snapshot or a forced Release
without it, or with a wrong one, is refused UNAUTHENTICATED before the servicer runs: the
job's process keeps running, its record stays RUNNING and registered. The same calls with
the token go through, and a scheduler of the same user on the host finds the same token.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from rlslice.adapters.auth import default_agent_token_path, local_agent_token
from rlslice.adapters.channel import open_channel
from rlslice.snapshot_agent.state import JobState
from rlslice.v1alpha1 import agent_pb2 as apb
from rlslice.v1alpha1 import agent_pb2_grpc

from .conftest import agent, code_of


@pytest.fixture
def token_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state directory of its own, so the node-local token file is this test's."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state-home"))
    return default_agent_token_path()


@pytest.mark.parametrize("token", [None, "not-the-agent-token"])
async def test_a_snapshot_or_release_without_the_token_is_refused_and_the_job_untouched(
    token: str | None,
    token_home: Path,
    agent_dirs: Callable[[str], dict[str, Any]],
    spawn_worker: Callable[..., Any],
) -> None:
    async with agent(agent_dirs("n1")) as running:
        assert running.settings.token is None  # nothing configured: the node-local token
        assert running.token == local_agent_token()
        assert stat.S_IMODE(os.stat(token_home).st_mode) == 0o600
        worker = await spawn_worker(running, "a", "g")
        async with open_channel(running.address, token=token) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            snapshot = stub.Snapshot(apb.SnapshotRequest(job="a", group="g", epoch=1), timeout=5)
            release = stub.Release(apb.ReleaseRequest(job="a", group="g", force=True), timeout=5)
            assert await code_of(snapshot) == grpc.StatusCode.UNAUTHENTICATED
            assert await code_of(release) == grpc.StatusCode.UNAUTHENTICATED
        assert worker.state not in ("T", "")  # neither frozen nor gone
        entry = running.engine.table.entries["a"]
        assert entry.record.state is JobState.RUNNING
        assert entry.record.epoch == 0
        assert not entry.released
        # With the token the same call goes through.
        async with open_channel(running.address, token=running.token) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            status = await stub.Status(apb.AgentStatusRequest(), timeout=5)
        assert [j.job for j in status.jobs] == ["a"]


async def test_a_token_file_others_can_read_is_refused(token_home: Path) -> None:
    local_agent_token()
    os.chmod(token_home, 0o644)
    with pytest.raises(PermissionError, match="0600"):
        local_agent_token()
