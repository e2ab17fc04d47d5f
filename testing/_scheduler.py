"""A real scheduler, in-process on loopback, for your own tests.

>>> async def test_my_loop():                                          # doctest: +SKIP
...     async with scheduler_for_tests(groups=["gpus"]) as sched:
...         async with AsyncClient(job="a", group="gpus", scheduler=sched.address) as c:
...             async with c.phase("train"):
...                 assert (await sched.group("gpus")).holder == "a"

>>> def test_my_sync_loop():                                           # doctest: +SKIP
...     with SchedulerForTests(groups=["gpus"]) as sched:
...         with Client(job="a", group="gpus", scheduler=sched.address) as c:
...             ...

It is the same scheduler `rlslice scheduler` runs (in-memory store, groups created on
first use), not a fake: what passes here passes against a deployed one. It needs the
`scheduler` extra (`pip install 'rlslice[scheduler]'`).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, cast

from google.protobuf.message import Message

from rlslice.adapters.channel import open_channel
from rlslice.adapters.wire import group_spec_to_proto
from rlslice.client._loop_thread import LoopThread
from rlslice.config import GroupSpec
from rlslice.v1alpha1 import scheduler_pb2 as pb
from rlslice.v1alpha1 import scheduler_pb2_grpc

if TYPE_CHECKING:
    from rlslice.scheduler import RunningScheduler

__all__ = ["SchedulerForTests", "TestScheduler", "scheduler_for_tests"]

T = TypeVar("T", bound=Message)

#: Seconds a stopping scheduler lets calls in flight finish.
STOP_GRACE = 0.5


class TestScheduler:
    """A running in-process scheduler: its `address` and a view of its groups."""

    __test__ = False  # not a pytest test class, despite the name

    def __init__(self, running: RunningScheduler, admin_token: str | None) -> None:
        self.running = running
        """The scheduler itself (`rlslice.scheduler.RunningScheduler`)."""
        self._token = admin_token

    @property
    def address(self) -> str:
        """`127.0.0.1:PORT`, to pass as `scheduler=` (or `RLSLICE_SCHEDULER`)."""
        return str(self.running.address)

    async def group(self, name: str) -> pb.GroupStatus:
        """The group's state as the scheduler reports it (holder, queue, epoch, jobs)."""
        return await self._call("GetGroup", pb.GetGroupRequest(group=name), pb.GroupStatus)

    async def put_group(self, spec: GroupSpec | str) -> pb.GroupStatus:
        """Create or replace a group (a name takes the default spec)."""
        if isinstance(spec, str):
            spec = GroupSpec(name=spec)
        request = pb.PutGroupRequest(spec=group_spec_to_proto(spec))
        return await self._call("PutGroup", request, pb.GroupStatus)

    async def _call(self, method: str, request: Message, response: type[T]) -> T:
        async with open_channel(self.address, token=self._token) as channel:
            stub: Any = scheduler_pb2_grpc.SchedulerStub(channel)
            return cast(T, await getattr(stub, method)(request, timeout=10))

    async def stop(self, grace: float = STOP_GRACE) -> None:
        """Stop the scheduler; calls in flight fail with UNAVAILABLE after `grace` seconds."""
        await self.running.stop(grace)


@asynccontextmanager
async def scheduler_for_tests(
    groups: Iterable[GroupSpec | str] = (), **settings: Any
) -> AsyncIterator[TestScheduler]:
    """Run a scheduler on `127.0.0.1:0` for the duration of the block.

    `groups` (names or `GroupSpec`s) exist from the start; others are created on first
    use. Keyword arguments override fields of `rlslice.scheduler.SchedulerSettings`
    (`store=PATH` for SQLite, `address="127.0.0.1:PORT"` to restart on one port, ...).
    """
    from rlslice.scheduler import SchedulerSettings, start_scheduler

    specs = tuple(GroupSpec(name=g) if isinstance(g, str) else g for g in groups)
    fields: dict[str, Any] = {"address": "127.0.0.1:0", "store": "memory"}
    fields["auto_create_groups"] = True
    fields.update(settings)
    fields["groups"] = (*fields.get("groups", ()), *specs)
    config = SchedulerSettings(**fields)
    started = start_scheduler(config)
    running: RunningScheduler = await started if inspect.isawaitable(started) else started
    sched = TestScheduler(running, _admin_token(config))
    try:
        yield sched
    finally:
        await sched.stop()


def _admin_token(config: object) -> str | None:
    token = getattr(config, "admin_token", None)
    return str(token) if token else None


class SchedulerForTests:
    """`with SchedulerForTests(groups=[...]) as sched:` — the same scheduler for sync tests,
    running on a background thread. Same arguments as `scheduler_for_tests`."""

    def __init__(self, groups: Iterable[GroupSpec | str] = (), **settings: Any) -> None:
        self._groups = tuple(groups)
        self._settings = settings
        self._thread: LoopThread | None = None
        self._context: Any = None
        self._sched: TestScheduler | None = None

    @property
    def address(self) -> str:
        """`127.0.0.1:PORT` of the running scheduler."""
        return self._running().address

    def group(self, name: str) -> pb.GroupStatus:
        """The group's state as the scheduler reports it."""
        sched = self._running()
        return cast(pb.GroupStatus, self._run(lambda: sched.group(name)))

    def put_group(self, spec: GroupSpec | str) -> pb.GroupStatus:
        """Create or replace a group."""
        sched = self._running()
        return cast(pb.GroupStatus, self._run(lambda: sched.put_group(spec)))

    def _running(self) -> TestScheduler:
        if self._sched is None:
            raise RuntimeError("SchedulerForTests is not running: use it in a `with` block")
        return self._sched

    def _run(self, make: Any) -> Any:
        assert self._thread is not None
        return self._thread.run(make)

    def __enter__(self) -> SchedulerForTests:
        self._thread = LoopThread(name="rlslice-test-scheduler")
        self._context = scheduler_for_tests(self._groups, **self._settings)
        try:
            self._sched = self._run(self._context.__aenter__)
        except BaseException:
            self._thread.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self._run(lambda: self._context.__aexit__(exc_type, exc, tb))
        finally:
            self._sched = None
            if self._thread is not None:
                self._thread.stop()
