"""The `app` backend and the workload loop.

Unit part: `AppBackend` over in-process links (a real `WorkloadLink`: it runs a real
offloader in a thread, as `serve_offload` does).
- snapshot: every workload offloads at once; bytes summed; restore brings all back.
- discard tags (the snapshot's and the group option's) reach only workloads that have the
  tag and support DISCARD.
- a failing workload (a vLLM offloader whose server is gone): the others are restored,
  BackendError names the workload; a workload silent past the deadline is restored too.
- no workload stream: BackendError naming serve_offload.
- state is UNKNOWN (only the workload knows); probe is usable.
- the workload side: a second offloader failing restores the first; the reply says why.
- an offload thread's `wait_connected` returns once a snapshot can find the stream; it
  times out with no agent, and reports a loop that stopped on an error.
- a snapshot of a job whose stream is still attaching waits for it (up to 10 s) and moves it.

End to end: a real agent (`start_agent`, backend app) on a Unix socket in tmp_path,
`serve_offload` with a real `TorchOffloader` in this process, Snapshot/Restore over the
Agent gRPC service: tensors freed and back bit-identical; after an agent restart the loop
reconnects and answers again.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from rlslice.client.offload import (  # noqa: E402
    Offloader,
    OffloadResult,
    TorchOffloader,
    VllmOffloader,
    serve_offload,
)
from rlslice.client.offload._serve import Combined  # noqa: E402
from rlslice.snapshot_agent.backends.app import AppBackend  # noqa: E402
from rlslice.snapshot_agent.backends.base import (  # noqa: E402
    BackendContext,
    BackendError,
    BackendState,
    JobHandle,
    OffloadAction,
    WorkloadAnswer,
)


class InProcessLink:
    """A `WorkloadLink` that runs an offloader in a thread, as the workload loop does."""

    def __init__(self, offloader: Offloader) -> None:
        self.offloader = offloader
        self.modes = offloader.modes
        self.tags = offloader.tags
        self.local_server = None
        self.pid = 0
        self.rank: int | None = None
        self.commands: list[tuple[OffloadAction, tuple[str, ...]]] = []
        self.offload_tags: list[tuple[str, ...] | None] = []
        """Each command's tags to copy (None: not a partial offload)."""

    async def command(
        self,
        action: OffloadAction,
        *,
        epoch: int,
        discard_tags: Sequence[str],
        timeout: float,
        offload_tags: Sequence[str] | None = None,
    ) -> WorkloadAnswer:
        self.commands.append((action, tuple(discard_tags)))
        self.offload_tags.append(None if offload_tags is None else tuple(offload_tags))
        try:
            if action is OffloadAction.OFFLOAD and offload_tags is not None:
                result = await asyncio.to_thread(
                    lambda: Combined([self.offloader]).offload(
                        discard_tags, offload_tags=offload_tags
                    )
                )
            elif action is OffloadAction.OFFLOAD:
                result = await asyncio.to_thread(self.offloader.offload, discard_tags)
            else:
                result = await asyncio.to_thread(self.offloader.restore)
        except Exception as error:
            return WorkloadAnswer(ok=False, error=str(error))
        return WorkloadAnswer(ok=True, bytes=result.bytes, seconds=result.seconds)


class Slow:
    """An offloader that takes longer than any deadline in these tests."""

    modes = frozenset({"offload"})
    tags = ("slow",)

    def __init__(self) -> None:
        self.restored = 0

    def offload(self, discard_tags: Sequence[str] = ()) -> OffloadResult:
        time.sleep(0.5)
        return OffloadResult(bytes=1, seconds=0.5)

    def restore(self) -> OffloadResult:
        self.restored += 1
        return OffloadResult(bytes=0, seconds=0.0)


def torch_workload(size: int, tags: dict[str, str]) -> tuple[TorchOffloader, list[torch.Tensor]]:
    offloader = TorchOffloader()
    tensors = []
    for tag, mode in tags.items():
        tensor = torch.randn(size)
        offloader.register(tensor, tag, mode=mode)
        tensors.append(tensor)
    return offloader, tensors


def backend(tmp_path: Path) -> AppBackend:
    return AppBackend(BackendContext(node="n1", state_dir=tmp_path))


def handle(*links: InProcessLink, discard: tuple[str, ...] = (), **options: str) -> JobHandle:
    return JobHandle(
        job="job-a", group="g", pids=(), workloads=links, options=options, discard_tags=discard
    )


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_every_workload_offloads_and_restores(tmp_path: Path) -> None:
    first, (a,) = torch_workload(100, {"weights": "offload"})
    second, (b,) = torch_workload(50, {"weights": "offload"})
    saved = (a.clone(), b.clone())
    app = backend(tmp_path)
    job = handle(InProcessLink(first), InProcessLink(second))
    out = await app.snapshot(job, deadline=time.time() + 10)
    assert out.bytes == 600
    assert a.untyped_storage().nbytes() == 0
    assert b.untyped_storage().nbytes() == 0
    back = await app.restore(job, deadline=time.time() + 10)
    assert back.bytes == 600
    assert torch.equal(a, saved[0])
    assert torch.equal(b, saved[1])


async def test_discard_tags_reach_only_workloads_that_can_discard_them(tmp_path: Path) -> None:
    torch_link = InProcessLink(torch_workload(10, {"weights": "offload", "kv": "offload"})[0])
    plain = InProcessLink(Slow())
    plain.modes = frozenset({"offload"})
    plain.tags = ("kv",)
    plain.offloader = torch_workload(10, {"kv": "offload"})[0]
    job = handle(torch_link, plain, discard=("kv",), discard_tags="weights, other")
    await backend(tmp_path).snapshot(job, deadline=time.time() + 10)
    assert torch_link.commands == [(OffloadAction.OFFLOAD, ("kv", "weights"))]
    assert plain.commands == [(OffloadAction.OFFLOAD, ())]


async def test_a_failing_workload_rolls_the_others_back(tmp_path: Path) -> None:
    good, (tensor,) = torch_workload(100, {"weights": "offload"})
    saved = tensor.clone()
    good_link = InProcessLink(good)
    gone = InProcessLink(VllmOffloader(closed_port(), timeout=2.0, measure=lambda: None))
    with pytest.raises(BackendError, match=r"workload 1 of job job-a: .*127\.0\.0\.1"):
        await backend(tmp_path).snapshot(handle(good_link, gone), deadline=time.time() + 10)
    assert [c[0] for c in good_link.commands] == [OffloadAction.OFFLOAD, OffloadAction.RESTORE]
    assert [c[0] for c in gone.commands] == [OffloadAction.OFFLOAD]  # it said it moved nothing
    assert torch.equal(tensor, saved)


async def test_a_workload_silent_past_the_deadline_is_restored_too(tmp_path: Path) -> None:
    slow = Slow()
    link = InProcessLink(slow)
    start = time.monotonic()
    with pytest.raises(BackendError, match="no answer by the deadline"):
        await backend(tmp_path).snapshot(handle(link), deadline=time.time() + 0.1)
    assert time.monotonic() - start < 2.0
    assert [c[0] for c in link.commands] == [OffloadAction.OFFLOAD, OffloadAction.RESTORE]


async def test_a_job_without_a_workload_stream_is_told_what_to_run(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="serve_offload"):
        await backend(tmp_path).snapshot(handle(), deadline=time.time() + 1)


async def test_state_is_unknown_and_the_probe_needs_nothing(tmp_path: Path) -> None:
    app = backend(tmp_path)
    assert await app.state(handle()) is BackendState.UNKNOWN
    assert (await app.probe()).usable


# --- end to end, with the real agent ---------------------------------------------------


@pytest.fixture
def agent_settings(tmp_path: Path) -> object:
    from rlslice.snapshot_agent.settings import AgentSettings

    return AgentSettings(
        node="n1",
        address="127.0.0.1:0",
        socket_path=tmp_path / "agent.sock",
        state_dir=tmp_path / "state",
        backend="app",
    )


async def _move(address: str, action: str, epoch: int) -> object:
    from rlslice.adapters.auth import local_agent_token
    from rlslice.adapters.channel import open_channel
    from rlslice.v1alpha1 import agent_pb2, agent_pb2_grpc

    # The agent has no token configured: it takes the node-local one.
    async with open_channel(address, token=local_agent_token()) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        if action == "snapshot":
            return await stub.Snapshot(
                agent_pb2.SnapshotRequest(job="job-a", group="g", epoch=epoch), timeout=10
            )
        return await stub.Restore(
            agent_pb2.RestoreRequest(job="job-a", group="g", epoch=epoch), timeout=10
        )


async def _until_attached(agent: object) -> None:
    engine = agent.engine  # type: ignore[attr-defined]
    for _ in range(200):
        entry = engine.table.entries.get("job-a")
        if entry is not None and entry.workloads:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the workload stream never attached")


async def test_serve_offload_answers_a_real_agent_and_reconnects_after_its_restart(
    agent_settings: object,
) -> None:
    from rlslice.snapshot_agent.agent import start_agent

    offloader, (weights,) = torch_workload(1000, {"weights": "offload"})
    saved = weights.clone()
    agent = await start_agent(agent_settings)  # type: ignore[arg-type]
    loop = asyncio.create_task(
        serve_offload(offloader, job="job-a", group="g", socket_path=str(agent.socket_path))
    )
    try:
        await _until_attached(agent)
        parked = await _move(agent.address, "snapshot", 1)
        assert parked.bytes == 4000  # type: ignore[attr-defined]
        assert weights.untyped_storage().nbytes() == 0
        back = await _move(agent.address, "restore", 2)
        assert back.bytes == 4000  # type: ignore[attr-defined]
        assert torch.equal(weights, saved)

        await agent.stop()
        agent = await start_agent(agent_settings)  # type: ignore[arg-type]
        await _until_attached(agent)
        parked = await _move(agent.address, "snapshot", 3)
        assert parked.bytes == 4000  # type: ignore[attr-defined]
        await _move(agent.address, "restore", 4)
        assert torch.equal(weights, saved)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        await agent.stop()


async def test_a_workload_whose_second_offloader_fails_restores_the_first_and_says_why() -> None:
    from rlslice.client.offload._serve import Combined, answer
    from rlslice.v1alpha1 import agent_pb2

    offloader, (weights,) = torch_workload(100, {"weights": "offload"})
    saved = weights.clone()
    both = Combined([offloader, VllmOffloader(closed_port(), timeout=2.0, measure=lambda: None)])
    command = agent_pb2.WorkloadCommand(
        command_id=7, action=agent_pb2.WorkloadCommand.ACTION_OFFLOAD, epoch=3
    )
    reply = await answer(both, command)
    assert reply.command_id == 7
    assert not reply.ok
    assert "UnavailableError" in reply.error
    assert not offloader.offloaded
    assert torch.equal(weights, saved)


async def test_an_offload_thread_says_when_the_agent_can_switch_the_job(
    agent_settings: object, tmp_path: Path
) -> None:
    from rlslice._errors import DeadlineExceededError, UnavailableError
    from rlslice.client.offload import start_offload_thread
    from rlslice.snapshot_agent.agent import start_agent

    offloader, (_weights,) = torch_workload(1000, {"weights": "offload"})
    agent = await start_agent(agent_settings)  # type: ignore[arg-type]
    thread = start_offload_thread(
        offloader, job="job-a", group="g", socket_path=str(agent.socket_path)
    )
    try:
        await asyncio.to_thread(thread.wait_connected, 10)
        # No polling: a snapshot right after the wait finds the stream.
        parked = await _move(agent.address, "snapshot", 1)
        assert parked.bytes == 4000  # type: ignore[attr-defined]
        await _move(agent.address, "restore", 2)
    finally:
        await asyncio.to_thread(thread.stop)
        await agent.stop()

    nobody = start_offload_thread(
        offloader, job="job-a", group="g", socket_path=str(tmp_path / "none.sock")
    )
    with pytest.raises(DeadlineExceededError, match="offload stream"):
        await asyncio.to_thread(nobody.wait_connected, 0.3)
    await asyncio.to_thread(nobody.stop)

    broken = start_offload_thread(offloader, job="Not_An_Id", group="g")
    with pytest.raises(UnavailableError, match="offload loop stopped"):
        await asyncio.to_thread(broken.wait_connected, 10)


async def test_a_snapshot_waits_for_a_workload_stream_that_is_still_attaching(
    agent_settings: object,
) -> None:
    from rlslice.adapters.channel import open_channel
    from rlslice.snapshot_agent.agent import start_agent
    from rlslice.v1alpha1 import agent_pb2, agent_pb2_grpc

    offloader, (weights,) = torch_workload(1000, {"weights": "offload"})
    agent = await start_agent(agent_settings)  # type: ignore[arg-type]
    loop = None
    try:
        # Registered (as the offload loop does first), but its stream not open yet.
        async with open_channel(f"unix:{agent.socket_path}") as channel:
            await agent_pb2_grpc.LocalAgentStub(channel).Register(
                agent_pb2.LocalRegisterRequest(
                    job="job-a", group="g", modes=[agent_pb2.OFFLOAD_MODE_OFFLOAD], backend="app"
                ),
                timeout=10,
            )
        snapshot = asyncio.ensure_future(_move(agent.address, "snapshot", 1))
        await asyncio.sleep(0.3)
        assert not snapshot.done()  # waiting for the stream, not failed
        loop = asyncio.create_task(
            serve_offload(
                offloader,
                job="job-a",
                group="g",
                socket_path=str(agent.socket_path),
                register=False,
            )
        )
        parked = await asyncio.wait_for(snapshot, 10)
        assert parked.bytes == 4000  # type: ignore[attr-defined]
        assert weights.untyped_storage().nbytes() == 0
        await _move(agent.address, "restore", 2)
    finally:
        if loop is not None:
            loop.cancel()
            await asyncio.gather(loop, return_exceptions=True)
        await agent.stop()
