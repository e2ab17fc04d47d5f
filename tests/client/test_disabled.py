"""With no scheduler configured the client passes everything through, so code runs alone.

Cases (sync and async): acquire returns a grant marked disabled with epoch 0; yield returns
a disabled result; phases work as context managers and decorators; exactly
one INFO line is logged per client; ids given are still validated; a closed client refuses
calls; neither face opens a network connection.
"""

from __future__ import annotations

import logging

import pytest

from rlslice._errors import FailedPreconditionError, InvalidArgumentError
from rlslice.client import AsyncClient, Client, Grant, YieldResult


@pytest.fixture(autouse=True)
def no_scheduler(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RLSLICE_SCHEDULER", "RLSLICE_JOB", "RLSLICE_GROUP", "RLSLICE_AGENT_SOCKET"):
        monkeypatch.delenv(name, raising=False)


async def test_an_async_disabled_client_grants_at_once_and_says_so() -> None:
    async with AsyncClient(job="solo", group="gpus") as client:
        assert client.disabled
        grant = await client.acquire(timeout=1)
        assert grant == Grant(0, 0.0, False, 0.0, 0, "gpus", "solo", disabled=True)
        assert await client.yield_() == YieldResult(0, False, disabled=True)


async def test_async_phases_pass_through_as_blocks_and_decorators() -> None:
    client = AsyncClient()
    calls: list[str] = []

    @client.phase("rollout")
    async def rollout(n: int) -> int:
        calls.append("rollout")
        return n * 2

    async with client.phase("train") as grant:
        calls.append("train")
        assert grant.disabled
    assert await rollout(21) == 42
    assert calls == ["train", "rollout"]
    assert rollout.__name__ == "rollout"
    await client.close()


def test_a_sync_disabled_client_passes_phases_through() -> None:
    with Client(job="solo") as client:
        assert client.disabled

        @client.phase("rollout")
        def rollout() -> str:
            return "done"

        with client.phase("train", group="trainer-pool") as grant:
            assert grant.disabled
            assert grant.group == "trainer-pool"
        assert rollout() == "done"
        assert client.acquire().epoch == 0
        assert client.yield_().disabled


def test_a_disabled_client_logs_exactly_one_info_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="rlslice.client"):
        client = Client(job="solo")
        with client.phase("train"):
            pass
        client.acquire()
        client.close()
    lines = [r for r in caplog.records if r.name == "rlslice.client"]
    assert len(lines) == 1
    assert lines[0].levelno == logging.INFO
    assert "disabled" in lines[0].getMessage()


def test_a_disabled_client_still_refuses_bad_ids() -> None:
    with pytest.raises(InvalidArgumentError, match=r"^job: "):
        Client(job="Not_A_Label")
    client = Client()
    with pytest.raises(InvalidArgumentError, match=r"^group: "):
        client.phase("train", group="BAD")
    with pytest.raises(InvalidArgumentError, match=r"^phase: "):
        client.phase("")
    with pytest.raises(InvalidArgumentError, match=r"^timeout: "):
        client.acquire(timeout=-1)
    client.close()


def test_a_closed_client_refuses_calls() -> None:
    client = Client()
    client.close()
    client.close()  # closing twice is fine
    with pytest.raises(FailedPreconditionError, match=r"^client: closed"):
        client.acquire()


async def test_the_async_decorator_refuses_plain_functions() -> None:
    client = AsyncClient()
    with pytest.raises(TypeError, match="async functions"):
        client.phase("train")(lambda: None)  # type: ignore[arg-type]
    sync_client = Client()

    async def coroutine() -> None:
        pass

    with pytest.raises(TypeError, match="plain functions"):
        sync_client.phase("train")(coroutine)
    await client.close()
    sync_client.close()


async def test_a_client_says_it_is_closed_once_close_began() -> None:
    client = AsyncClient(job="solo")
    assert not client.closed
    await client.close()
    assert client.closed
    with pytest.raises(FailedPreconditionError):
        await client.acquire()
