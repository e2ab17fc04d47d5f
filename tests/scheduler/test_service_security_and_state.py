"""Tokens, restarts, metrics and max-hold preemption, against live schedulers.

Cases: with tokens set, a call without a token is UNAUTHENTICATED, a job token cannot put
groups or register agents (PERMISSION_DENIED), the admin and agent tokens can, health needs
none, and refusals change nothing; a scheduler restarted on the same SQLite file has the
same holder, queue order, parked set and epoch, the holder's lease still works and a
waiter that calls again rejoins in place; two schedulers in one process each serve their
own metrics; TLS serves verified clients and refuses plaintext. (Max-hold preemption runs
on the loop's fake clock: test_engine_clock.py.)
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlslice.adapters.channel import open_channel
from rlslice.config import GroupSpec, TLSConfig
from rlslice.v1alpha1 import scheduler_pb2 as pb
from rlslice.v1alpha1 import scheduler_pb2_grpc

TOKENS = {"job_token": "job-secret", "admin_token": "admin-secret", "agent_token": "agent-secret"}


async def _code(call: Any) -> grpc.StatusCode:
    try:
        await call
    except grpc.aio.AioRpcError as error:
        return error.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize(
    ("token", "method", "message", "expected"),
    [
        (None, "Register", pb.RegisterRequest(job="a", group="g"), grpc.StatusCode.UNAUTHENTICATED),
        ("wrong", "Register", pb.RegisterRequest(job="a", group="g"), grpc.StatusCode.UNAUTHENTICATED),
        ("job-secret", "PutGroup", pb.PutGroupRequest(spec=pb.GroupSpec(name="h")), grpc.StatusCode.PERMISSION_DENIED),
        ("job-secret", "DeleteGroup", pb.DeleteGroupRequest(group="g"), grpc.StatusCode.PERMISSION_DENIED),
        ("job-secret", "RegisterAgent", pb.RegisterAgentRequest(node="n1", address="127.0.0.1:9"), grpc.StatusCode.PERMISSION_DENIED),
        ("agent-secret", "PutGroup", pb.PutGroupRequest(spec=pb.GroupSpec(name="h")), grpc.StatusCode.PERMISSION_DENIED),
        ("admin-secret", "PutGroup", pb.PutGroupRequest(spec=pb.GroupSpec(name="h")), grpc.StatusCode.OK),
        ("agent-secret", "RegisterAgent", pb.RegisterAgentRequest(node="n1", address="127.0.0.1:9"), grpc.StatusCode.OK),
        ("job-secret", "Register", pb.RegisterRequest(job="a", group="g"), grpc.StatusCode.OK),
        ("admin-secret", "Register", pb.RegisterRequest(job="a", group="g"), grpc.StatusCode.OK),
    ],
)  # fmt: skip
async def test_token_roles_are_enforced_and_refusals_change_nothing(
    start_live: Callable[..., Any],
    token: str | None,
    method: str,
    message: Any,
    expected: grpc.StatusCode,
) -> None:
    async with start_live(**TOKENS) as live:
        live.engine.put_group(GroupSpec(name="g"))
        before = dict(live.engine.groups)
        states = {name: r.state for name, r in before.items()}
        async with open_channel(live.running.address, token=token) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            assert await _code(getattr(stub, method)(message)) == expected
            health = health_pb2_grpc.HealthStub(channel)
            assert (await health.Check(health_pb2.HealthCheckRequest())).status == 1
        if expected != grpc.StatusCode.OK:
            assert {n: r.state for n, r in live.engine.groups.items()} == states
            assert live.running.coordinator.agents == {}


async def test_a_restart_on_the_same_file_keeps_holder_queue_parked_and_epoch(
    start_live: Callable[..., Any], tmp_path: Path
) -> None:
    path = str(tmp_path / "state.db")
    async with start_live(store=path) as live:
        leases = {job: await live.register(job) for job in "abcd"}
        await live.acquire("b", leases["b"])
        waiting_d = asyncio.ensure_future(live.acquire("d", leases["d"]))
        await live.waiting("d")
        await live.yield_("b", leases["b"])
        await waiting_d
        await live.yield_("d", leases["d"])
        await live.acquire("a", leases["a"])
        calls = []
        for job in "cb":  # one after the other, so the queue order is known
            calls.append(asyncio.ensure_future(live.acquire(job, leases[job])))
            await live.waiting(job)
        before = await live.group()
        assert before.holder == "a"
        assert list(before.queue) == ["c", "b"]
    await asyncio.wait(calls, timeout=10)
    for call in calls:  # the stopped scheduler granted neither waiter
        assert call.done()
        if call.cancelled():
            continue  # the test's channel closed before the server's goodbye arrived
        error = call.exception()
        assert isinstance(error, grpc.aio.AioRpcError), error
        assert error.code() == grpc.StatusCode.UNAVAILABLE
    async with start_live(store=path) as live:
        after = await live.group()
        assert after.holder == before.holder
        assert list(after.queue) == list(before.queue)
        assert list(after.parked) == list(before.parked)
        assert list(after.resident) == list(before.resident)
        assert after.epoch == before.epoch
        # b calls again: it keeps its place behind c, who has not come back yet.
        waiting_b = asyncio.ensure_future(live.acquire("b", leases["b"]))
        await live.waiting("b")
        assert list((await live.group()).queue) == ["c", "b"]
        answer = await live.yield_("a", leases["a"])  # the old lease still proves a
        assert answer.waiters == 1
        grant = await asyncio.wait_for(waiting_b, 5)
        assert grant.epoch > before.epoch


async def test_each_scheduler_serves_its_own_metrics(start_live: Callable[..., Any]) -> None:
    async with start_live(metrics_port=0) as one, start_live(metrics_port=0) as two:
        lease = await one.register("a")
        await one.acquire("a", lease)
        await one.yield_("a", lease)
        texts = [
            await asyncio.to_thread(_get, f"http://127.0.0.1:{live.running.metrics_port}/metrics")
            for live in (one, two)
        ]
    assert "rlslice_scheduler_acquire_wait_seconds_count 1.0" in texts[0]
    assert "rlslice_scheduler_acquire_wait_seconds_count 0.0" in texts[1]
    for name in (
        "rlslice_scheduler_switch_seconds",
        "rlslice_scheduler_moved_bytes_total",
        'rlslice_scheduler_queue_depth{group="g"}',
        'rlslice_scheduler_held_seconds_total{group="g"}',
        'rlslice_scheduler_switches_total{group="g",outcome="done"}',
        'rlslice_scheduler_busy_fraction{group="g"}',
    ):
        assert name in texts[0], name


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
async def test_tls_serves_verified_clients_and_refuses_plaintext(
    start_live: Callable[..., Any], tmp_path: Path
) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    await asyncio.to_thread(
        subprocess.run,
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True,
    )  # fmt: skip
    async with start_live(tls=TLSConfig(cert=cert, key=key)) as live:
        async with open_channel(live.running.address, tls=TLSConfig(ca=cert)) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            answer = await stub.Register(pb.RegisterRequest(job="a", group="g"), timeout=5)
            assert answer.lease_id
        async with open_channel(live.running.address) as plain:
            stub = scheduler_pb2_grpc.SchedulerStub(plain)
            code = await _code(stub.Register(pb.RegisterRequest(job="b", group="g"), timeout=2))
            assert code in {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
        assert list(live.engine.groups["g"].state.jobs) == ["a"]
