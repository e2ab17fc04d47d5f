"""Jobs no agent of their group knows are visible, and a group can refuse them.

A real `rlslice up --backend app` (scheduler and agent, node "n1") in a process, and real
clients in this one. Cases:
- a job whose process never registered with the agent is let in with a warning (the
  client logs the scheduler's word), marked lock only in `GetGroup`, `rlslice status
  --json` and the table, and counted by a metric;
- a job whose process registered with the agent first (the client with
  RLSLICE_AGENT_SOCKET) is not lock only;
- a group with `require_agent_registration` refuses the unknown job (FAILED_PRECONDITION)
  with a message naming job, group and node;
- the pure verdict: no agents, or a node that did not answer, gives no lock-only verdict.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import grpc
import pytest

from rlslice._errors import FailedPreconditionError
from rlslice.client import Client
from rlslice.scheduler.core.registration import judge
from rlslice.testing import free_port
from rlslice.v1alpha1 import scheduler_pb2 as pb
from rlslice.v1alpha1 import scheduler_pb2_grpc


class Up:
    def __init__(self, address: str, agent_socket: str, metrics: int) -> None:
        self.address, self.agent_socket, self.metrics = address, agent_socket, metrics

    def group(self, name: str) -> pb.GroupStatus:
        with grpc.insecure_channel(self.address) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            return stub.GetGroup(pb.GetGroupRequest(group=name), timeout=10)

    def cli(self, *args: str) -> str:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RLSLICE_")}
        done = subprocess.run(
            [sys.executable, "-m", "rlslice.apps", "status", "--scheduler", self.address, *args],
            env=env | {"PYTHONSAFEPATH": "1"},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return done.stdout


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    work = tmp_path_factory.mktemp("up")
    config = work / "groups.yaml"
    config.write_text(
        "groups:\n"
        "  - {name: open, backend: app}\n"
        "  - {name: strict, backend: app, require_agent_registration: true}\n"
    )
    address, metrics = f"127.0.0.1:{free_port()}", free_port()
    argv = [
        sys.executable, "-m", "rlslice.apps", "--log-level", "WARNING", "up",
        "--address", address, "--store", str(work / "scheduler.sqlite"), "--node", "n1",
        "--socket", str(work / "agent.sock"), "--state-dir", str(work / "agent"),
        "--backend", "app", "--group-config", str(config), "--metrics-port", str(metrics),
        "--host-reserve-bytes", "0",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLSLICE_")}
    log = (work / "up.log").open("wb")
    process = subprocess.Popen(
        argv, env=env | {"PYTHONSAFEPATH": "1"}, stdout=subprocess.PIPE, stderr=log
    )
    try:
        assert process.stdout is not None
        for raw in process.stdout:  # printed once scheduler and agent both serve
            if raw.decode().startswith("agent "):
                break
        else:
            pytest.fail((work / "up.log").read_text())
        running = Up(address, str(work / "agent.sock"), metrics)
        # The agent joins the scheduler on its own schedule, after that line.
        deadline = time.monotonic() + 30
        while not running.group("open").nodes:
            assert time.monotonic() < deadline, "the agent did not join within 30 s"
            time.sleep(0.05)
        assert list(running.group("open").nodes) == ["n1"]
        yield running
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


@pytest.fixture(autouse=True)
def no_agent_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("RLSLICE_"):
            monkeypatch.delenv(name)


def test_a_job_no_agent_knows_is_warned_marked_and_counted(
    up: Up, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="rlslice.client")
    with Client(job="lonely", group="open", scheduler=up.address) as client:
        with client.phase("train"):
            pass
        warnings = [r.getMessage() for r in caplog.records if "lonely" in r.getMessage()]
        assert len(warnings) == 1
        assert "known to no agent of group 'open' (node n1)" in warnings[0]
        assert "lock only" in warnings[0]
        (job,) = up.group("open").jobs
        assert (job.job, job.lock_only) == ("lonely", True)
        (status,) = json.loads(up.cli("open", "--json"))
        assert status["jobs"][0]["lock_only"] is True
        header, row = up.cli("open").splitlines()
        start = header.index("lock only")
        assert row[start:].split()[0] == "lonely"
    with urllib.request.urlopen(f"http://127.0.0.1:{up.metrics}/metrics", timeout=10) as page:
        text = page.read().decode()
    assert 'rlslice_scheduler_lock_only_registrations_total{group="open"} 1.0' in text


def test_a_job_registered_with_the_agent_first_is_not_lock_only(
    up: Up, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLSLICE_AGENT_SOCKET", up.agent_socket)
    # Its first call registers the process with the agent, then with the scheduler.
    with Client(job="known", group="open", scheduler=up.address) as client:
        with client.phase("train"):
            pass
        (job,) = [j for j in up.group("open").jobs if j.job == "known"]
        assert job.lock_only is False


def test_a_group_that_requires_registration_refuses_an_unknown_job_by_name(up: Up) -> None:
    with (
        Client(job="stranger", group="strict", scheduler=up.address) as client,
        pytest.raises(FailedPreconditionError) as refused,
    ):
        client.acquire(timeout=30)
    message = str(refused.value)
    assert "'stranger'" in message
    assert "'strict'" in message
    assert "node n1" in message
    assert "requires agent registration" in message
    assert up.group("strict").jobs == []


@pytest.mark.parametrize(
    ("nodes", "answers", "lock_only"),
    [
        ((), {}, False),  # no agents: a pure lock by design
        (("n1", "n2"), {"n1": []}, False),  # n2 did not answer: it may know the job
        (("n1", "n2"), {"n1": [], "n2": [("job", "other")]}, True),  # known elsewhere
        (("n1",), {"n1": [("job", "g")]}, False),
    ],
)
def test_the_verdict_needs_every_agent_to_answer(
    nodes: tuple[str, ...], answers: dict[str, list[tuple[str, str]]], lock_only: bool
) -> None:
    assert judge("job", "g", nodes, answers).lock_only is lock_only
