"""The `app` backend's partial moves (issue 26): a workload's tags are the job's parts.

Unit part: `AppBackend` over in-process links running real offloaders in a thread.
- a partial snapshot (`offload_tags` option: stripped, empty entries dropped) tells each
  rank the tags it holds of those to copy and of the discard tags; other parts stay on the
  device; the bytes are those copied; the restore brings back only what was parked.
- a workload that cannot DISCARD copies its discard tags instead.
- a whole snapshot sends no tags to copy (what every link has always been sent).
- a tag no workload of the job holds: refused as an options error, nothing sent.
- an offloader that moves whole (here two tags at once) named in part refuses, nothing
  moved; the ranks that moved are restored and the snapshot fails naming why.
- the workload loop: a partial command naming a tag none of its offloaders holds is
  refused with nothing moved; one naming no tag moves nothing.
- the transparent path: one `MemorySaverOffloader` per region tag pauses only the region
  a partial command names (torch-memory-saver faked at its boundary, as in
  test_memory_saver_offloader.py); one for every region ("all") is refused a partial
  command naming other tags.

End to end: a real agent (backend app) on a Unix socket, `serve_offload` with a real
`TorchOffloader` holding a model, its Adam state and a KV cache; a partial Snapshot over
the Agent gRPC service (`offload_tags: optimizer`, `discard_tags: kv_cache`), then Restore:
the weights never leave, the optimizer state is freed and back bit-identical, the KV cache
comes back zero-filled, and the bytes reported are the optimizer's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from rlslice.client.offload import (  # noqa: E402
    MemorySaverOffloader,
    OffloadResult,
    TorchOffloader,
    serve_offload,
)
from rlslice.client.offload._serve import Combined  # noqa: E402
from rlslice.config import OFFLOAD_TAGS_OPTION  # noqa: E402
from rlslice.snapshot_agent.backends.base import (  # noqa: E402
    BackendError,
    OffloadAction,
    OptionsError,
)

from .test_app_backend import InProcessLink, backend, handle, torch_workload  # noqa: E402
from .test_memory_saver_offloader import FakeSaver  # noqa: E402


def deadline() -> float:
    return time.time() + 30


class TwoTagsAtOnce:
    """An offloader that moves whole: its two tags go together or not at all (as vLLM)."""

    modes = frozenset({"offload", "discard"})
    tags = ("weights", "kv_cache")

    def __init__(self) -> None:
        self.offloads = 0

    def offload(self, discard_tags: Sequence[str] = ()) -> OffloadResult:
        self.offloads += 1
        return OffloadResult(bytes=1000, seconds=0.0)

    def restore(self) -> OffloadResult:
        return OffloadResult(bytes=0, seconds=0.0)


async def test_a_partial_snapshot_moves_only_the_named_parts_of_every_rank(
    tmp_path: Path,
) -> None:
    first, (w1, o1, kv) = torch_workload(
        100, {"weights": "offload", "optimizer": "offload", "kv_cache": "offload"}
    )
    second, (w2, o2) = torch_workload(50, {"weights": "offload", "optimizer": "offload"})
    saved = [t.clone() for t in (w1, o1, w2, o2)]
    one, two = InProcessLink(first), InProcessLink(second)
    job = handle(one, two, discard=("kv_cache",), **{OFFLOAD_TAGS_OPTION: " optimizer, ,"})

    out = await backend(tmp_path).snapshot(job, deadline=deadline())
    assert out.bytes == (100 + 50) * 4  # the optimizer's, copied; the KV cache not counted
    assert one.commands == [(OffloadAction.OFFLOAD, ("kv_cache",))]
    assert one.offload_tags == [("optimizer",)]
    assert two.commands == [(OffloadAction.OFFLOAD, ())]
    assert two.offload_tags == [("optimizer",)]
    assert o1.untyped_storage().nbytes() == 0
    assert o2.untyped_storage().nbytes() == 0
    assert kv.untyped_storage().nbytes() == 0
    assert torch.equal(w1, saved[0])
    assert torch.equal(w2, saved[2])

    back = await backend(tmp_path).restore(job, deadline=deadline())
    assert back.bytes == (100 + 50) * 4
    assert all(torch.equal(a, b) for a, b in zip((w1, o1, w2, o2), saved, strict=True))
    assert torch.count_nonzero(kv) == 0


async def test_a_workload_that_cannot_discard_copies_its_discard_tags(tmp_path: Path) -> None:
    offloader, (weights, cache) = torch_workload(10, {"weights": "offload", "cache": "offload"})
    saved = cache.clone()
    link = InProcessLink(offloader)
    link.modes = frozenset({"offload"})
    job = handle(link, discard=("cache",), **{OFFLOAD_TAGS_OPTION: ""})

    out = await backend(tmp_path).snapshot(job, deadline=deadline())
    assert link.offload_tags == [("cache",)]
    assert out.bytes == 10 * 4
    assert weights.untyped_storage().nbytes() == 10 * 4
    await backend(tmp_path).restore(job, deadline=deadline())
    assert torch.equal(cache, saved)


async def test_a_whole_snapshot_sends_no_tags_to_copy(tmp_path: Path) -> None:
    link = InProcessLink(torch_workload(10, {"weights": "offload"})[0])
    out = await backend(tmp_path).snapshot(handle(link), deadline=deadline())
    assert out.bytes == 40
    assert link.offload_tags == [None]


async def test_a_partial_snapshot_naming_a_tag_no_workload_holds_is_refused_first(
    tmp_path: Path,
) -> None:
    link = InProcessLink(torch_workload(10, {"weights": "offload"})[0])
    job = handle(link, discard=("kv_cache",), **{OFFLOAD_TAGS_OPTION: "optimizer"})
    with pytest.raises(OptionsError, match=r"holds optimizer, kv_cache \(they hold weights\)"):
        await backend(tmp_path).snapshot(job, deadline=deadline())
    assert link.commands == []


async def test_an_offloader_that_moves_whole_refuses_a_part_and_the_others_come_back(
    tmp_path: Path,
) -> None:
    offloader, (optimizer,) = torch_workload(25, {"optimizer": "offload"})
    saved = optimizer.clone()
    torch_link = InProcessLink(offloader)
    whole = TwoTagsAtOnce()
    whole_link = InProcessLink(whole)
    job = handle(
        torch_link, whole_link, discard=("kv_cache",), **{OFFLOAD_TAGS_OPTION: "optimizer"}
    )

    with pytest.raises(BackendError, match=r"workload 1 of job job-a: .*moves its tags"):
        await backend(tmp_path).snapshot(job, deadline=deadline())
    assert whole.offloads == 0
    assert [c[0] for c in torch_link.commands] == [OffloadAction.OFFLOAD, OffloadAction.RESTORE]
    assert torch.equal(optimizer, saved)


async def test_the_transparent_path_pauses_only_the_named_region(tmp_path: Path) -> None:
    saver = FakeSaver()
    regions = [
        MemorySaverOffloader(tag=tag, saver=saver, measure=saver.measure)
        for tag in ("weights", "optimizer")
    ]
    link = InProcessLink(Combined(regions))  # as `serve_offload` holds them
    job = handle(link, **{OFFLOAD_TAGS_OPTION: "optimizer"})
    await backend(tmp_path).snapshot(job, deadline=deadline())
    assert saver.calls == [("pause", "optimizer")]
    await backend(tmp_path).restore(job, deadline=deadline())
    assert saver.calls == [("pause", "optimizer"), ("resume", "optimizer")]


async def test_the_transparent_path_over_every_region_moves_whole(tmp_path: Path) -> None:
    saver = FakeSaver()
    link = InProcessLink(MemorySaverOffloader(saver=saver, measure=saver.measure))
    job = handle(link, **{OFFLOAD_TAGS_OPTION: "optimizer"})
    with pytest.raises(OptionsError, match="they hold all"):
        await backend(tmp_path).snapshot(job, deadline=deadline())
    assert saver.calls == []


async def test_the_workload_loop_refuses_a_partial_command_naming_a_tag_it_lacks() -> None:
    from rlslice.client.offload._serve import answer
    from rlslice.v1alpha1 import agent_pb2

    offloader, (weights,) = torch_workload(10, {"weights": "offload"})
    command = agent_pb2.WorkloadCommand(
        command_id=3,
        action=agent_pb2.WorkloadCommand.ACTION_OFFLOAD,
        offload_tags=["weights", "optimizer"],
        partial=True,
    )
    reply = await answer(offloader, command)
    assert not reply.ok
    assert "no offloader of this process holds optimizer" in reply.error
    assert weights.untyped_storage().nbytes() == 40  # nothing moved

    nothing = agent_pb2.WorkloadCommand(
        command_id=4, action=agent_pb2.WorkloadCommand.ACTION_OFFLOAD, partial=True
    )
    reply = await answer(offloader, nothing)
    assert reply.ok
    assert reply.bytes == 0
    assert weights.untyped_storage().nbytes() == 40  # partial, no tag named: all resident


# --- end to end, with the real agent ---------------------------------------------------


async def test_a_partial_snapshot_through_the_agent_parks_only_the_optimizer(
    tmp_path: Path,
) -> None:
    from rlslice.adapters.auth import local_agent_token
    from rlslice.adapters.channel import open_channel
    from rlslice.snapshot_agent.agent import start_agent
    from rlslice.snapshot_agent.settings import AgentSettings
    from rlslice.v1alpha1 import agent_pb2, agent_pb2_grpc

    torch.manual_seed(0)
    model = torch.nn.Linear(32, 16)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(torch.randn(4, 32)).pow(2).mean().backward()
    optimizer.step()
    kv_cache = torch.randn(256)
    offloader = TorchOffloader(device_type="cpu")
    offloader.register(model, "weights")
    offloader.register(optimizer, "optimizer")
    offloader.register(kv_cache, "kv_cache")
    weights = [p.detach().clone() for p in model.parameters()]
    pointers = [p.data_ptr() for p in model.parameters()]
    state = [v.clone() for s in optimizer.state.values() for v in s.values()]
    state_bytes = sum(v.untyped_storage().nbytes() for v in state)  # steps and moments

    settings = AgentSettings(
        node="n1",
        address="127.0.0.1:0",
        socket_path=tmp_path / "agent.sock",
        state_dir=tmp_path / "state",
        backend="app",
    )
    agent = await start_agent(settings)
    connected = asyncio.Event()
    loop = asyncio.create_task(
        serve_offload(
            offloader,
            job="job-a",
            group="g",
            socket_path=str(agent.socket_path),
            on_connected=connected.set,
        )
    )
    try:
        await asyncio.wait_for(connected.wait(), 30)
        async with open_channel(agent.address, token=local_agent_token()) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            parked = await stub.Snapshot(
                agent_pb2.SnapshotRequest(
                    job="job-a",
                    group="g",
                    epoch=1,
                    options={OFFLOAD_TAGS_OPTION: "optimizer"},
                    discard_tags=["kv_cache"],
                ),
                timeout=30,
            )
            assert parked.state == agent_pb2.AGENT_JOB_STATE_PARKED
            assert parked.bytes == state_bytes
            assert all(
                v.untyped_storage().nbytes() == 0
                for s in optimizer.state.values()
                for v in s.values()
            )
            assert kv_cache.untyped_storage().nbytes() == 0
            assert [p.data_ptr() for p in model.parameters()] == pointers
            assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights, strict=True))

            back = await stub.Restore(
                agent_pb2.RestoreRequest(job="job-a", group="g", epoch=2), timeout=30
            )
            assert back.bytes == state_bytes
        after = [v for s in optimizer.state.values() for v in s.values()]
        assert all(torch.equal(a, b) for a, b in zip(after, state, strict=True))
        assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights, strict=True))
        assert torch.count_nonzero(kv_cache) == 0
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        await agent.stop()
