"""`TorchOffloader` with real torch on CPU (the fallback path: plain host buffers, no stream).

Case matrix:
- offload → restore: parameters, buffers, gradients and optimizer state bit-identical;
  the same tensor and storage objects; views still alias their base.
- while offloaded every planned storage holds 0 bytes.
- DISCARD: a discard-mode tag, and an offload tag named in discard_tags, are freed without
  a copy and come back zero-filled; a storage reached from a kept tag is kept.
- training with an offload/restore between every step computes bit-identical losses.
- a repeated offload moves nothing; a restore with nothing offloaded is a no-op.
- a failure while copying leaves everything resident and intact.
- host buffers are kept for the next swap and can be freed (not while offloaded).
- bad registration input names the field.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from rlslice._errors import FailedPreconditionError, InvalidArgumentError  # noqa: E402
from rlslice.client.offload import TorchOffloader  # noqa: E402


def model_and_optimizer(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    return model, optimizer


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int, swap=None):  # type: ignore[no-untyped-def]
    generator = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(8, 16, generator=generator)
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if swap:
            swap()
    return losses


def snapshot_of(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    tensors = [t.detach().clone() for t in model.state_dict().values()]
    tensors += [p.grad.clone() for p in model.parameters() if p.grad is not None]
    for state in optimizer.state.values():
        tensors += [v.clone() for v in state.values() if isinstance(v, torch.Tensor)]
    return tensors


def test_offload_and_restore_are_bit_identical_and_keep_every_reference() -> None:
    model, optimizer = model_and_optimizer()
    train(model, optimizer, 3)
    offloader = TorchOffloader(chunk_bytes=256)  # several chunks per storage
    offloader.register(model, "weights")
    offloader.register(optimizer, "optimizer")
    before = snapshot_of(model, optimizer)
    weight = model[0].weight
    storage_ptr = weight.untyped_storage()._cdata
    row = weight.data[3]

    result = offloader.offload()
    assert offloader.offloaded
    assert weight.untyped_storage().nbytes() == 0
    assert all(t.untyped_storage().nbytes() == 0 for t in model.state_dict().values())
    expected = sum(t.untyped_storage().nbytes() for t in before)
    assert result.bytes == expected

    back = offloader.restore()
    assert back.bytes == expected
    assert not offloader.offloaded
    after = snapshot_of(model, optimizer)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert model[0].weight is weight
    assert weight.untyped_storage()._cdata == storage_ptr
    row.add_(1.0)  # the view still aliases the parameter
    assert torch.equal(weight.data[3], row)


def test_discarded_tags_are_freed_and_come_back_zero_filled() -> None:
    weights = torch.randn(64)
    kv_cache = torch.randn(128)
    scratch = torch.randn(32)
    offloader = TorchOffloader()
    offloader.register(weights, "weights")
    offloader.register(kv_cache, "kv-cache", mode="discard")
    offloader.register(scratch, "scratch")
    saved = weights.clone()

    result = offloader.offload(discard_tags=["scratch"])
    assert result.bytes == (64 + 128 + 32) * 4
    assert kv_cache.untyped_storage().nbytes() == 0
    offloader.restore()
    assert torch.equal(weights, saved)
    assert torch.count_nonzero(kv_cache) == 0
    assert torch.count_nonzero(scratch) == 0
    assert offloader.tags == ("weights", "kv-cache", "scratch")


def test_a_storage_reached_from_a_kept_tag_is_kept() -> None:
    shared = torch.randn(16)
    offloader = TorchOffloader()
    offloader.register(shared[:8], "cache", mode="discard")
    offloader.register(shared, "weights")
    saved = shared.clone()
    offloader.offload()
    offloader.restore()
    assert torch.equal(shared, saved)


def test_training_with_a_swap_after_every_step_is_bit_identical() -> None:
    alone = train(*model_and_optimizer(), steps=12)
    model, optimizer = model_and_optimizer()
    offloader = TorchOffloader(chunk_bytes=1000)
    offloader.register(model, "weights")
    offloader.register(optimizer, "optimizer")

    def swap() -> None:
        offloader.offload()
        offloader.restore()

    sliced = train(model, optimizer, steps=12, swap=swap)
    assert sliced == alone  # exact float equality: bit-identical


def test_repeats_are_no_ops() -> None:
    tensor = torch.randn(10)
    offloader = TorchOffloader()
    offloader.register(tensor, "weights")
    assert offloader.restore().bytes == 0
    assert offloader.offload().bytes == 40
    assert offloader.offload().bytes == 0
    assert offloader.restore().bytes == 40
    assert offloader.restore().bytes == 0


def test_a_failure_while_copying_leaves_everything_resident() -> None:
    first, second = torch.randn(100), torch.randn(200)
    offloader = TorchOffloader()
    offloader.register([first, second], "weights")
    saved = (first.clone(), second.clone())
    allocate = offloader._host_buffer
    calls = []

    def failing(nbytes: int) -> torch.Tensor:
        calls.append(nbytes)
        if len(calls) == 2:
            raise MemoryError("pinned allocation failed")
        return allocate(nbytes)

    offloader._host_buffer = failing  # type: ignore[method-assign]
    with pytest.raises(MemoryError):
        offloader.offload()
    assert not offloader.offloaded
    assert torch.equal(first, saved[0])
    assert torch.equal(second, saved[1])


def test_host_buffers_are_kept_between_swaps_and_can_be_freed() -> None:
    tensor = torch.randn(256)
    offloader = TorchOffloader()
    offloader.register(tensor, "weights")
    offloader.offload()
    with pytest.raises(FailedPreconditionError):
        offloader.free_host_buffers()
    offloader.restore()
    assert offloader.free_host_buffers() == 1024
    assert offloader.free_host_buffers() == 0


@pytest.mark.parametrize(("tag", "mode", "field"), [("", "offload", "tag"), ("w", "evict", "mode")])
def test_bad_registrations_name_the_field(tag: str, mode: str, field: str) -> None:
    with pytest.raises(InvalidArgumentError, match=field):
        TorchOffloader().register(torch.zeros(1), tag, mode=mode)
