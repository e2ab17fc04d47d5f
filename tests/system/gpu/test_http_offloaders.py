"""`VllmOffloader` and `SglangOffloader` against fake servers on loopback (aiohttp).

Case matrix:
- vLLM: offload POSTs /sleep?level=1&mode=wait (level=2 when "weights" is discarded, or
  when built with level 2; mode keep or abort when asked, anything else refused); restore
  POSTs /wake_up; a repeat sends nothing; bytes are the device memory freed / taken back
  (measured around the call).
- an API key: sent as `Authorization: Bearer`, and a server that wants one refuses without.
- SGLang: release / resume with the tags body; modes depend on the CPU backup.
- errors: an HTTP 500 names the status; a closed port is UNAVAILABLE.
- only loopback: any other host, a bad port or a bad level is refused at construction.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from rlslice._errors import FailedPreconditionError, InvalidArgumentError, UnavailableError
from rlslice.client.offload import SglangOffloader, VllmOffloader

GiB = 1 << 30


@dataclass
class FakeServer:
    """An inference server's sleep endpoints; `used` is its device memory."""

    port: int = 0
    requests: list[tuple[str, str, Any]] = field(default_factory=list)
    used: int = 10 * GiB
    fail_with: int = 0
    api_key: str = ""

    def measure(self) -> int:
        return self.used

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        self.requests.append((request.path, request.query_string, body))
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.Response(status=401, text="Unauthorized")
        if self.fail_with:
            return web.Response(status=self.fail_with, text="engine is busy")
        if request.path in ("/sleep", "/release_memory_occupation"):
            self.used = 2 * GiB
        else:
            self.used = 10 * GiB
        return web.json_response({})


@pytest.fixture
async def server() -> AsyncIterator[FakeServer]:
    fake = FakeServer()
    app = web.Application()
    for path in ("/sleep", "/wake_up", "/release_memory_occupation", "/resume_memory_occupation"):
        app.router.add_post(path, fake.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    fake.port = runner.addresses[0][1]
    yield fake
    await runner.cleanup()


async def test_vllm_sleeps_at_level_1_and_wakes_up(server: FakeServer) -> None:
    vllm = VllmOffloader(server.port, measure=server.measure)
    out = await asyncio.to_thread(vllm.offload)
    assert server.requests == [("/sleep", "level=1&mode=wait", None)]
    assert out.bytes == 8 * GiB
    back = await asyncio.to_thread(vllm.restore)
    assert server.requests[-1][0] == "/wake_up"
    assert back.bytes == 8 * GiB


@pytest.mark.parametrize(
    ("level", "discard", "expected"),
    [
        (1, [], "level=1&mode=wait"),
        (1, ["kv_cache"], "level=1&mode=wait"),
        (1, ["weights"], "level=2&mode=wait"),
        (2, [], "level=2&mode=wait"),
    ],
)
async def test_vllm_drops_the_weights_only_at_level_2(
    server: FakeServer, level: int, discard: list[str], expected: str
) -> None:
    vllm = VllmOffloader(server.port, level=level, measure=server.measure)
    await asyncio.to_thread(vllm.offload, discard)
    assert server.requests[0][1] == expected


@pytest.mark.parametrize("mode", ["keep", "abort"])
async def test_vllm_sleeps_in_the_mode_asked_for(server: FakeServer, mode: str) -> None:
    vllm = VllmOffloader(server.port, mode=mode, measure=server.measure)
    await asyncio.to_thread(vllm.offload)
    assert server.requests[0][1] == f"level=1&mode={mode}"


def test_an_unknown_vllm_sleep_mode_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="mode"):
        VllmOffloader(8000, mode="drain")


async def test_the_api_key_goes_in_the_authorization_header(server: FakeServer) -> None:
    server.api_key = "s3cret"
    without = SglangOffloader(server.port, measure=server.measure)
    with pytest.raises(FailedPreconditionError, match="401"):
        await asyncio.to_thread(without.offload)
    keyed = SglangOffloader(server.port, api_key="s3cret", measure=server.measure)
    assert (await asyncio.to_thread(keyed.offload)).bytes == 8 * GiB
    await asyncio.to_thread(keyed.restore)
    vllm = VllmOffloader(server.port, api_key="s3cret", measure=server.measure)
    await asyncio.to_thread(vllm.offload)
    assert [r[0] for r in server.requests[-3:]] == [
        "/release_memory_occupation",
        "/resume_memory_occupation",
        "/sleep",
    ]


async def test_a_repeated_sleep_or_wake_sends_nothing(server: FakeServer) -> None:
    vllm = VllmOffloader(server.port, measure=server.measure)
    assert (await asyncio.to_thread(vllm.restore)).bytes == 0
    await asyncio.to_thread(vllm.offload)
    assert (await asyncio.to_thread(vllm.offload)).bytes == 0
    assert [r[0] for r in server.requests] == ["/sleep"]


async def test_sglang_releases_and_resumes_with_its_tags(server: FakeServer) -> None:
    sglang = SglangOffloader(server.port, tags=["kv_cache"], measure=server.measure)
    assert sglang.modes == frozenset({"discard"})
    out = await asyncio.to_thread(sglang.offload)
    await asyncio.to_thread(sglang.restore)
    assert server.requests == [
        ("/release_memory_occupation", "", {"tags": ["kv_cache"]}),
        ("/resume_memory_occupation", "", {"tags": ["kv_cache"]}),
    ]
    assert out.bytes == 8 * GiB
    backed_up = SglangOffloader(server.port, weights_cpu_backup=True)
    assert backed_up.modes == frozenset({"offload", "discard"})
    assert backed_up.tags == ("weights", "kv_cache", "cuda_graph")


async def test_an_http_error_names_the_status(server: FakeServer) -> None:
    server.fail_with = 500
    vllm = VllmOffloader(server.port, measure=server.measure)
    with pytest.raises(FailedPreconditionError, match="answered 500: engine is busy"):
        await asyncio.to_thread(vllm.offload)
    # Still awake as far as the offloader knows: a retry really sends the request.
    server.fail_with = 0
    await asyncio.to_thread(vllm.offload)
    assert len(server.requests) == 2


async def test_a_closed_port_is_unavailable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    vllm = VllmOffloader(port, timeout=2.0)
    with pytest.raises(UnavailableError, match=f"127.0.0.1:{port}"):
        await asyncio.to_thread(vllm.offload)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"port": 8000, "host": "10.0.0.1"}, "host"),
        ({"port": 8000, "host": "vllm.internal"}, "host"),
        ({"port": 0}, "port"),
        ({"port": 70000}, "port"),
        ({"port": 8000, "level": 3}, "level"),
    ],
)
def test_only_the_jobs_own_loopback_server_is_accepted(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgumentError, match=field):
        VllmOffloader(**kwargs)
