"""Multi-group phases (`phase(name, groups=[...])`) against a real scheduler on loopback.

Cases:
- a phase over two groups holds both for its block, answers a dict of grants keyed by
  group in sorted order, and yields both at the end (async with, with, decorators);
- the groups are entered in sorted order whatever order is listed: with the first group
  taken, the job holds nothing and waits for it;
- two jobs that list two groups in opposite orders both complete many rounds, never both
  inside at once (async clients, and sync clients on threads);
- a failure acquiring the second group leaves the first released: the task cancelled,
  the second group deleted under the waiter, an ABORTED acquire (a cycle through an outer
  phase), close() from another task;
- a multi-group phase nested in a single-group phase shares its hold;
- bad arguments (group and groups, duplicates, none, a string, a bad id) are refused
  with InvalidArgumentError naming the field, before anything reaches the scheduler;
- a disabled client answers a disabled grant per group;
- each client object registers with a session of its own (the deadlock check's thread).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable

import pytest

from rlslice._errors import (
    AbortedError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
)
from rlslice.client import AsyncClient, Client, Grant
from rlslice.testing import SchedulerForTests, TestScheduler, scheduler_for_tests
from rlslice.v1alpha1 import scheduler_pb2 as pb

from .conftest import eventually

ROUNDS = 25


@pytest.fixture
async def two() -> AsyncIterator[TestScheduler]:
    async with scheduler_for_tests(groups=["sampler-pool", "trainer-pool"]) as running:
        yield running


async def _holders(sched: TestScheduler, *groups: str) -> list[str]:
    return [(await sched.group(g)).holder for g in groups]


async def test_a_phase_over_two_groups_holds_both_and_yields_both(two: TestScheduler) -> None:
    async with AsyncClient(job="a", scheduler=two.address) as client:
        async with client.phase("sync", groups=["trainer-pool", "sampler-pool"]) as grants:
            assert list(grants) == ["sampler-pool", "trainer-pool"]
            assert all(isinstance(g, Grant) and g.job == "a" for g in grants.values())
            assert [g.group for g in grants.values()] == list(grants)
            assert await _holders(two, "sampler-pool", "trainer-pool") == ["a", "a"]
        assert await _holders(two, "sampler-pool", "trainer-pool") == ["", ""]

        @client.phase("sync", groups=["trainer-pool", "sampler-pool"])
        async def step(n: int) -> tuple[int, list[str]]:
            return n, await _holders(two, "sampler-pool", "trainer-pool")

        assert await step(3) == (3, ["a", "a"])
        assert await _holders(two, "sampler-pool", "trainer-pool") == ["", ""]


def test_the_sync_client_holds_both_groups_as_a_block_and_a_decorator() -> None:
    with (
        SchedulerForTests(groups=["g1", "g2"]) as sched,
        Client(job="a", scheduler=sched.address) as client,
    ):
        with client.phase("sync", groups=["g2", "g1"]) as grants:
            assert list(grants) == ["g1", "g2"]
            assert [sched.group(g).holder for g in ("g1", "g2")] == ["a", "a"]
        assert [sched.group(g).holder for g in ("g1", "g2")] == ["", ""]

        @client.phase("sync", groups=["g1", "g2"])
        def step() -> list[str]:
            return [sched.group(g).holder for g in ("g1", "g2")]

        assert step() == ["a", "a"]
        assert [sched.group(g).holder for g in ("g1", "g2")] == ["", ""]


async def test_the_groups_are_entered_in_sorted_order_whatever_the_listing(
    two: TestScheduler,
) -> None:
    async with (
        AsyncClient(job="a", scheduler=two.address) as a,
        AsyncClient(job="b", group="sampler-pool", scheduler=two.address) as b,
    ):
        await b.acquire()
        entering = asyncio.ensure_future(
            a.phase("sync", groups=["trainer-pool", "sampler-pool"]).__aenter__()
        )
        await eventually(two, "sampler-pool", lambda s: list(s.queue) == ["a"])
        assert (await two.group("trainer-pool")).holder == ""  # not taken out of order
        await b.yield_()
        grants = await asyncio.wait_for(entering, 5)
        assert list(grants) == ["sampler-pool", "trainer-pool"]
        await a._exit_phases(("sampler-pool", "trainer-pool"))
        assert await _holders(two, "sampler-pool", "trainer-pool") == ["", ""]


async def test_two_jobs_asking_in_opposite_orders_both_complete_many_rounds(
    two: TestScheduler,
) -> None:
    inside: set[str] = set()
    overlaps: list[tuple[str, ...]] = []
    waited: list[float] = []

    async def job(name: str, groups: list[str]) -> int:
        done = 0
        async with AsyncClient(job=name, scheduler=two.address) as client:
            for _ in range(ROUNDS):
                async with client.phase("sync", groups=groups) as grants:
                    waited.extend(g.waited_seconds for g in grants.values())
                    inside.add(name)
                    if len(inside) > 1:
                        overlaps.append(tuple(sorted(inside)))
                    await asyncio.sleep(0.002)
                    inside.discard(name)
                    done += 1
        return done

    rounds = await asyncio.wait_for(
        asyncio.gather(
            job("a", ["sampler-pool", "trainer-pool"]),
            job("b", ["trainer-pool", "sampler-pool"]),
        ),
        timeout=30,
    )
    assert rounds == [ROUNDS, ROUNDS]
    assert overlaps == []
    assert max(waited) > 0, "the jobs never contended"
    assert await _holders(two, "sampler-pool", "trainer-pool") == ["", ""]


def test_two_sync_jobs_on_threads_asking_in_opposite_orders_both_complete() -> None:
    inside: set[str] = set()
    overlaps: list[tuple[str, ...]] = []
    done: dict[str, int] = {}
    lock = threading.Lock()

    with SchedulerForTests(groups=["g1", "g2"]) as sched:

        def job(name: str, groups: list[str]) -> None:
            with Client(job=name, scheduler=sched.address) as client:
                for _ in range(ROUNDS):
                    with client.phase("sync", groups=groups):
                        with lock:
                            inside.add(name)
                            if len(inside) > 1:
                                overlaps.append(tuple(sorted(inside)))
                        with lock:
                            inside.discard(name)
                        done[name] = done.get(name, 0) + 1

        threads = [
            threading.Thread(target=job, args=("a", ["g1", "g2"])),
            threading.Thread(target=job, args=("b", ["g2", "g1"])),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads), "a job hung"
        assert done == {"a": ROUNDS, "b": ROUNDS}
        assert overlaps == []
        assert [sched.group(g).holder for g in ("g1", "g2")] == ["", ""]


async def _second_group_blocked(sched: TestScheduler, client: AsyncClient) -> asyncio.Task[object]:
    """`client` enters a phase over g1 and g2 while another job holds g2: once it holds g1
    and waits for g2, the task entering is returned."""
    task = asyncio.ensure_future(client.phase("sync", groups=["g1", "g2"]).__aenter__())
    await eventually(sched, "g2", lambda s: client.job in s.queue)
    assert (await sched.group("g1")).holder == client.job
    return task


async def test_a_cancelled_entry_leaves_the_first_group_released() -> None:
    async with (
        scheduler_for_tests(groups=["g1", "g2"]) as sched,
        AsyncClient(job="b", group="g2", scheduler=sched.address) as b,
        AsyncClient(job="a", scheduler=sched.address) as a,
    ):
        await b.acquire()
        task = await _second_group_blocked(sched, a)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        g1 = await eventually(sched, "g1", lambda s: s.holder == "")
        assert list(g1.queue) == []
        await eventually(sched, "g2", lambda s: list(s.queue) == [])
        assert (await sched.group("g2")).holder == "b"
        # The client's own bookkeeping agrees: the next phase acquires afresh.
        await b.yield_()
        async with a.phase("again", groups=["g1", "g2"]) as grants:
            assert grants["g1"].epoch > 0
        assert await _holders(sched, "g1", "g2") == ["", ""]


async def test_a_second_group_deleted_under_the_waiter_leaves_the_first_released() -> None:
    async with (
        scheduler_for_tests(groups=["g1", "g2"], auto_create_groups=False) as sched,
        AsyncClient(job="b", group="g2", scheduler=sched.address) as b,
        AsyncClient(job="a", scheduler=sched.address) as a,
    ):
        await b.acquire()
        task = await _second_group_blocked(sched, a)
        await sched._call(
            "DeleteGroup", pb.DeleteGroupRequest(group="g2", force=True), pb.DeleteGroupResponse
        )
        with pytest.raises(NotFoundError, match="g2"):
            await asyncio.wait_for(task, 5)
        assert (await sched.group("g1")).holder == ""


async def test_an_aborted_second_group_leaves_the_first_released_and_the_outer_held() -> None:
    # a holds g0 in an outer phase; b holds g2 and waits for g0. a's phase over g1 and g2
    # takes g1, then its wait for g2 closes a -> b -> a: ABORTED, and g1 is given back.
    async with (
        scheduler_for_tests(groups=["g0", "g1", "g2"]) as sched,
        AsyncClient(job="a", scheduler=sched.address) as a,
        AsyncClient(job="b", scheduler=sched.address) as b,
    ):
        async with a.phase("outer", group="g0"):
            await b.acquire(group="g2")
            b_waits = asyncio.ensure_future(b.acquire(group="g0"))
            await eventually(sched, "g0", lambda s: list(s.queue) == ["b"])
            with pytest.raises(AbortedError) as caught:
                async with a.phase("sync", groups=["g2", "g1"]):
                    pytest.fail("entered a deadlocked phase")
            assert str(caught.value).startswith(
                'deadlock: job "a" waits for group "g2" held by "b", which waits for group '
                '"g0" held by "a"'
            )
            assert await _holders(sched, "g0", "g1", "g2") == ["a", "", "b"]
            assert not b_waits.done()
        assert (await asyncio.wait_for(b_waits, 5)).group == "g0"


async def test_close_during_the_second_acquire_fails_and_leaves_nothing_held() -> None:
    async with (
        scheduler_for_tests(groups=["g1", "g2"]) as sched,
        AsyncClient(job="b", group="g2", scheduler=sched.address) as b,
    ):
        a = AsyncClient(job="a", scheduler=sched.address)
        await b.acquire()
        task = await _second_group_blocked(sched, a)
        await a.close()
        with pytest.raises(FailedPreconditionError, match="closed"):
            await asyncio.wait_for(task, 5)
        g1 = await sched.group("g1")
        assert (g1.holder, [j.job for j in g1.jobs]) == ("", [])


async def test_a_multi_group_phase_inside_a_single_group_phase_shares_its_hold(
    two: TestScheduler,
) -> None:
    async with AsyncClient(job="a", scheduler=two.address) as client:
        async with client.phase("outer", group="trainer-pool") as outer:
            async with client.phase("sync", groups=["sampler-pool", "trainer-pool"]) as grants:
                assert grants["trainer-pool"] == outer
            assert await _holders(two, "sampler-pool", "trainer-pool") == ["", "a"]
        assert await _holders(two, "sampler-pool", "trainer-pool") == ["", ""]


BAD: list[tuple[str, Callable[[AsyncClient | Client], object], str]] = [
    ("both", lambda c: c.phase("p", "g1", groups=["g2"]), "groups: give group= or groups="),
    ("twice", lambda c: c.phase("p", groups=["g1", "g2", "g1"]), "groups: 'g1' is listed twice"),
    ("none", lambda c: c.phase("p", groups=[]), "groups: must name at least one group"),
    ("a string", lambda c: c.phase("p", groups="g1"), "groups: must be a list"),
    ("a bad id", lambda c: c.phase("p", groups=["g1", "G_2"]), "groups[1]: 'G_2' is not"),
    ("not a string", lambda c: c.phase("p", groups=["g1", 3]), "groups[1]: must be a string"),
    ("a bad phase", lambda c: c.phase("", groups=["g1"]), "phase: must be a non-empty"),
]


@pytest.mark.parametrize(("make", "message"), [pytest.param(*b[1:], id=b[0]) for b in BAD])
@pytest.mark.parametrize("kind", [AsyncClient, Client])
async def test_bad_groups_are_refused_naming_the_field(
    sched: TestScheduler,
    kind: type[AsyncClient] | type[Client],
    make: Callable[[AsyncClient | Client], object],
    message: str,
) -> None:
    client = kind(job="a", scheduler=sched.address)
    try:
        with pytest.raises(InvalidArgumentError) as caught:
            make(client)
        assert str(caught.value).startswith(message)
    finally:
        result = client.close()
        if asyncio.iscoroutine(result):
            await result
    assert [j.job for j in (await sched.group("gpus")).jobs] == []


async def test_a_disabled_client_answers_a_disabled_grant_per_group() -> None:
    client = AsyncClient(job="a")
    async with client, client.phase("sync", groups=["g2", "g1"]) as grants:
        assert {g: (x.disabled, x.group) for g, x in grants.items()} == {
            "g1": (True, "g1"),
            "g2": (True, "g2"),
        }


async def test_each_client_object_registers_with_a_session_of_its_own(two: TestScheduler) -> None:
    # The scheduler's deadlock check follows sessions: the groups one client holds and
    # waits for are one thread; another client of the same job is another.
    async with (
        AsyncClient(job="a", scheduler=two.address) as trainer,
        AsyncClient(job="a", scheduler=two.address) as sampler,
    ):
        async with trainer.phase("t", groups=["trainer-pool"]):
            pass
        async with sampler.phase("s", group="sampler-pool"):
            pass
        groups = two.running.engine.groups
        trainer_session = groups["trainer-pool"].state.jobs["a"].session
        sampler_session = groups["sampler-pool"].state.jobs["a"].session
        assert len(trainer_session) == 16
        assert int(trainer_session, 16) >= 0  # hex
        assert len(sampler_session) == 16
        assert trainer_session != sampler_session
