"""A job on a node is bound to the uid that first registered it at the agent.

A process of another uid (a child of this test that drops to `nobody`, uid 65534) that
registers an existing job name over the agent's Unix socket is refused PERMISSION_DENIED
with a message naming the job; the owner's registration (its pid, its uid) stays. The
same process may register a job name of its own: the refusal is the binding, not the
socket's permissions. Needs root (to drop to another uid).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .conftest import agent

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to another uid")

_INTRUDER = """
import os, sys
import grpc
from rlslice.v1alpha1 import agent_pb2, agent_pb2_grpc
# Imports first: this interpreter's own files may be readable by root only.
os.setgroups([]); os.setgid(65534); os.setuid(65534)
channel = grpc.insecure_channel("unix:" + sys.argv[1])
try:
    agent_pb2_grpc.LocalAgentStub(channel).Register(
        agent_pb2.LocalRegisterRequest(job=sys.argv[2], group="g"), timeout=10
    )
    print("OK")
except grpc.RpcError as error:
    print(error.code().name, error.details())
"""


async def _register_as_nobody(socket_path: Path, job: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLSLICE_")}
    env["PYTHONSAFEPATH"] = "1"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _INTRUDER, str(socket_path), job,
        stdout=asyncio.subprocess.PIPE, env=env, cwd="/",
    )  # fmt: skip
    out, _ = await asyncio.wait_for(process.communicate(), 30)
    return out.decode().strip()


async def test_a_register_from_another_uid_for_an_existing_job_is_refused(
    agent_dirs: Callable[[str], dict[str, Any]], spawn_worker: Callable[..., Any]
) -> None:
    fields = agent_dirs("n1")
    os.chmod(fields["socket_path"].parent, 0o755)  # let `nobody` reach the socket
    async with agent(fields, socket_mode=0o666) as running:
        owner = await spawn_worker(running, "a")
        answer = await _register_as_nobody(running.socket_path, "a")
        assert answer.startswith("PERMISSION_DENIED"), answer
        assert "job a " in answer, answer
        assert "by uid 0, not uid 65534" in answer, answer
        status = await running.engine.status()
        assert {j.record.job: list(j.pids) for j in status.jobs} == {"a": [owner.process.pid]}
        assert running.engine.table.entries["a"].owner_uid == 0
        # The same process may take a name nobody holds: the socket let it in.
        assert await _register_as_nobody(running.socket_path, "b") == "OK"
