"""Deadlock detection as a job sees it: clients nesting single-group phases in opposite
orders, against a real scheduler on loopback (`rlslice.testing`).

Cases:
- job a enters g1 then g2, job b g2 then g1, a barrier making both hold their first group:
  exactly one gets AbortedError naming both jobs and both groups; once it has left its
  outer phase the other completes; several rounds, asyncio clients and sync clients on
  threads alike;
- the same jobs through one multi-group phase each never abort (the canonical order).
"""

from __future__ import annotations

import asyncio
import threading

from rlslice._errors import AbortedError
from rlslice.client import AsyncClient, Client
from rlslice.testing import SchedulerForTests, scheduler_for_tests

ROUNDS = 3


def _assert_names_both(message: str) -> None:
    assert message.startswith("deadlock: job ")
    for name in ('"a"', '"b"', '"g1"', '"g2"'):
        assert name in message
    assert "phase(groups=[...])" in message
    assert "\n" not in message


async def test_opposite_nesting_aborts_exactly_one_job_and_the_other_completes() -> None:
    async with (
        scheduler_for_tests(groups=["g1", "g2"]) as sched,
        AsyncClient(job="a", scheduler=sched.address) as a,
        AsyncClient(job="b", scheduler=sched.address) as b,
    ):
        for _ in range(ROUNDS):
            barrier = asyncio.Barrier(2)

            async def nest(
                client: AsyncClient, first: str, second: str, barrier: asyncio.Barrier
            ) -> str:
                async with client.phase("outer", group=first):
                    await barrier.wait()  # both hold their first group now
                    async with client.phase("inner", group=second):
                        holders = [(await sched.group(g)).holder for g in ("g1", "g2")]
                        assert holders == [client.job, client.job]
                return "done"

            results = await asyncio.wait_for(
                asyncio.gather(
                    nest(a, "g1", "g2", barrier),
                    nest(b, "g2", "g1", barrier),
                    return_exceptions=True,
                ),
                timeout=10,
            )
            aborted = [r for r in results if isinstance(r, AbortedError)]
            assert len(aborted) == 1, results
            assert results.count("done") == 1
            _assert_names_both(str(aborted[0]))
            assert [(await sched.group(g)).holder for g in ("g1", "g2")] == ["", ""]


def test_sync_clients_on_threads_nesting_in_opposite_orders_abort_exactly_one() -> None:
    with SchedulerForTests(groups=["g1", "g2"]) as sched:
        barrier = threading.Barrier(2, timeout=10)
        outcomes: dict[str, object] = {}

        def nest(job: str, first: str, second: str) -> None:
            with Client(job=job, scheduler=sched.address) as client:
                try:
                    with client.phase("outer", group=first):
                        barrier.wait()
                        with client.phase("inner", group=second):
                            outcomes[job] = "done"
                except AbortedError as error:
                    outcomes[job] = error

        threads = [
            threading.Thread(target=nest, args=("a", "g1", "g2")),
            threading.Thread(target=nest, args=("b", "g2", "g1")),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(15)
        assert not any(t.is_alive() for t in threads), "a job hung"
        aborted = [o for o in outcomes.values() if isinstance(o, AbortedError)]
        assert len(aborted) == 1, outcomes
        assert list(outcomes.values()).count("done") == 1
        _assert_names_both(str(aborted[0]))


async def test_the_same_jobs_through_one_multi_group_phase_never_abort() -> None:
    async with (
        scheduler_for_tests(groups=["g1", "g2"]) as sched,
        AsyncClient(job="a", scheduler=sched.address) as a,
        AsyncClient(job="b", scheduler=sched.address) as b,
    ):
        for _ in range(ROUNDS):
            barrier = asyncio.Barrier(2)

            async def both(client: AsyncClient, groups: list[str], barrier: asyncio.Barrier) -> str:
                await barrier.wait()
                async with client.phase("sync", groups=groups):
                    await asyncio.sleep(0.005)
                return "done"

            results = await asyncio.wait_for(
                asyncio.gather(both(a, ["g1", "g2"], barrier), both(b, ["g2", "g1"], barrier)),
                timeout=10,
            )
            assert results == ["done", "done"]
        failed = [e for g in ("g1", "g2") for e in sched.running.engine.groups[g].ring]
        assert not [e for e in failed if e.kind == "failed"]
