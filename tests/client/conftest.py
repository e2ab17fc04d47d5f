"""Fixtures for the client tests: a real scheduler in-process on loopback (no fakes).

Every test starts from a clean environment: the client reads RLSLICE_* variables, and a
developer's shell must not change what the tests see.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable

import pytest

from rlslice.testing import TestScheduler, scheduler_for_tests
from rlslice.v1alpha1 import scheduler_pb2 as pb


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("RLSLICE_"):
            monkeypatch.delenv(name)


@pytest.fixture
async def sched() -> AsyncIterator[TestScheduler]:
    async with scheduler_for_tests(groups=["gpus"]) as running:
        yield running


async def eventually(
    sched: TestScheduler,
    group: str,
    check: Callable[[pb.GroupStatus], bool],
    timeout: float = 5.0,
) -> pb.GroupStatus:
    """The group's status once `check` holds; fails with the last status after `timeout`.

    The scheduler acts on a cancelled call as soon as grpc tells it, which is not the same
    instant the client's cancel returns; this waits for that, no longer.
    """
    loop = asyncio.get_running_loop()
    give_up = loop.time() + timeout
    while True:
        status = await sched.group(group)
        if check(status) or loop.time() > give_up:
            assert check(status), f"condition never held; last status:\n{status}"
            return status
        await asyncio.sleep(0.02)
