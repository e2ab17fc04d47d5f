"""Fixtures for the security tests: certificates made with `openssl`, live schedulers and
agents on loopback (in-process: nothing is killed here), real job processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from rlslice.scheduler import SchedulerSettings, start_scheduler
from rlslice.snapshot_agent import AgentSettings, SimSettings, start_agent

WORKER = Path(__file__).parents[1] / "faults" / "worker.py"
MiB = 1 << 20


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("RLSLICE_"):
            monkeypatch.delenv(name)


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@dataclass(frozen=True)
class Pki:
    """A CA with a server certificate for 127.0.0.1 and a client certificate; `other_*` are
    signed by a second, untrusted CA."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path
    other_client_cert: Path
    other_client_key: Path


def _make_ca(folder: Path, name: str) -> tuple[Path, Path]:
    key, cert = folder / f"{name}.key", folder / f"{name}.pem"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", f"/CN={name}")  # fmt: skip
    return cert, key


def _make_leaf(folder: Path, ca: tuple[Path, Path], name: str, extension: str) -> tuple[Path, Path]:
    key, csr, cert = (folder / f"{name}.{ext}" for ext in ("key", "csr", "pem"))
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}")  # fmt: skip
    ext = folder / f"{name}.ext"
    ext.write_text(extension + "\n")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]),
             "-CAcreateserial", "-out", str(cert), "-days", "1", "-extfile", str(ext))  # fmt: skip
    return cert, key


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    folder = tmp_path_factory.mktemp("pki")
    ca = _make_ca(folder, "rlslice-ca")
    server = _make_leaf(folder, ca, "server", "subjectAltName=IP:127.0.0.1")
    client = _make_leaf(folder, ca, "client", "extendedKeyUsage=clientAuth")
    other = _make_ca(folder, "other-ca")
    other_client = _make_leaf(folder, other, "intruder", "extendedKeyUsage=clientAuth")
    return Pki(ca[0], *server, *client, other[0], *other_client)


async def code_of(call: Awaitable[Any]) -> grpc.StatusCode:
    """The status code a call ends with (OK when it succeeds)."""
    try:
        await call
    except grpc.aio.AioRpcError as error:
        return error.code()
    return grpc.StatusCode.OK


@contextlib.asynccontextmanager
async def scheduler(**settings: Any) -> AsyncIterator[Any]:
    """A scheduler on 127.0.0.1:0 with `settings`."""
    fields: dict[str, Any] = {"address": "127.0.0.1:0"}
    fields.update(settings)
    running = await start_scheduler(SchedulerSettings(**fields))
    try:
        yield running
    finally:
        await running.stop(0.1)


@pytest.fixture
def agent_dirs() -> Iterator[Callable[[str], dict[str, Any]]]:
    """Settings fields that give an agent of node `n` its own state, socket and devices."""
    short = Path(tempfile.mkdtemp(prefix="rs-", dir="/tmp"))
    shm = Path(
        tempfile.mkdtemp(
            prefix="rlslice-sec-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
        )
    )

    def fields(node: str) -> dict[str, Any]:
        return {
            "node": node,
            "state_dir": short / f"state-{node}",
            "socket_path": short / f"{node}.sock",
            "host_reserve_bytes": 0,
            "sim": SimSettings(root=shm, capacity_bytes=64 * MiB, rate_gbps=0.0),
        }

    yield fields
    shutil.rmtree(short, ignore_errors=True)
    shutil.rmtree(shm, ignore_errors=True)


@contextlib.asynccontextmanager
async def agent(fields: dict[str, Any], **settings: Any) -> AsyncIterator[Any]:
    running = await start_agent(AgentSettings(**{**fields, **settings}))
    try:
        yield running
    finally:
        await running.stop(0)


class Worker:
    """A job's GPU worker process registered with an agent (tests/system/faults/worker.py)."""

    def __init__(self, process: asyncio.subprocess.Process, info: dict[str, Any]) -> None:
        self.process = process
        self.info = info

    async def call(self, **command: Any) -> dict[str, Any]:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(json.dumps(command).encode() + b"\n")
        await self.process.stdin.drain()
        answer: dict[str, Any] = json.loads(
            await asyncio.wait_for(self.process.stdout.readline(), 20)
        )
        return answer

    @property
    def state(self) -> str:
        try:
            text = Path(f"/proc/{self.process.pid}/stat").read_text()
        except OSError:
            return ""
        return text[text.rfind(")") + 2]


@pytest.fixture
async def spawn_worker() -> AsyncIterator[Callable[..., Awaitable[Worker]]]:
    started: list[Worker] = []

    async def spawn(running_agent: Any, job: str, group: str = "g") -> Worker:
        node_dir = running_agent.settings.sim.root / running_agent.node
        env = {k: v for k, v in os.environ.items() if not k.startswith("RLSLICE_")}
        env["PYTHONSAFEPATH"] = "1"
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(WORKER), "worker", str(running_agent.socket_path),
            str(node_dir), job, group,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env,
        )  # fmt: skip
        assert process.stdout is not None
        info = json.loads(await asyncio.wait_for(process.stdout.readline(), 20))
        worker = Worker(process, info)
        started.append(worker)
        return worker

    yield spawn
    for worker in started:
        with contextlib.suppress(ProcessLookupError):
            worker.process.kill()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(worker.process.wait(), 5)
