"""`TorchOffloader`'s partial offload (`offload_tags`, issue 26) with real torch on CPU.

Case matrix:
- moved tags: their storages hold 0 bytes while parked and come back bit-identical, the
  same storage objects; the result counts the bytes copied only.
- resident tags (neither copied nor discarded): untouched, the same data pointer and
  values, through the offload and the restore; so is a storage a resident tag shares with
  a moved one.
- discard tags, and a discard-mode tag named to copy: freed without a copy, zero-filled
  on restore, not counted as copied.
- an empty list copies nothing and frees only the discard tags.
- a repeat while parked moves nothing; the restore brings back only what was parked; a
  whole offload afterwards moves everything again.
- a storage that cannot be resized, appearing since registration: refused before anything
  moves when its tag moves, ignored when its tag stays resident.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from rlslice._errors import FailedPreconditionError  # noqa: E402
from rlslice.client.offload import TorchOffloader  # noqa: E402


def three_parts() -> tuple[TorchOffloader, dict[str, torch.Tensor]]:
    """Weights, optimizer state and a KV cache, each a part of its own."""
    torch.manual_seed(0)
    tensors = {
        "weights": torch.randn(64),
        "optimizer": torch.randn(128),
        "kv_cache": torch.randn(32),
    }
    offloader = TorchOffloader(chunk_bytes=96)  # several chunks per storage
    for tag, tensor in tensors.items():
        offloader.register(tensor, tag)
    return offloader, tensors


def test_a_partial_offload_frees_the_moved_tags_and_leaves_the_others_on_the_device() -> None:
    offloader, tensors = three_parts()
    saved = {tag: t.clone() for tag, t in tensors.items()}
    weights_ptr = tensors["weights"].data_ptr()
    optimizer_storage = tensors["optimizer"].untyped_storage()._cdata

    result = offloader.offload(["kv_cache"], offload_tags=["optimizer"])
    assert result.bytes == 128 * 4  # copied only: the discarded KV cache is not counted
    assert offloader.offloaded
    assert tensors["optimizer"].untyped_storage().nbytes() == 0
    assert tensors["kv_cache"].untyped_storage().nbytes() == 0
    assert tensors["weights"].data_ptr() == weights_ptr
    assert torch.equal(tensors["weights"], saved["weights"])

    back = offloader.restore()
    assert back.bytes == 128 * 4
    assert not offloader.offloaded
    assert torch.equal(tensors["optimizer"], saved["optimizer"])
    assert tensors["optimizer"].untyped_storage()._cdata == optimizer_storage
    assert torch.count_nonzero(tensors["kv_cache"]) == 0
    assert tensors["weights"].data_ptr() == weights_ptr
    assert torch.equal(tensors["weights"], saved["weights"])


def test_a_storage_a_resident_tag_shares_with_a_moved_tag_stays_resident() -> None:
    shared = torch.randn(16)
    own = torch.randn(8)
    offloader = TorchOffloader()
    offloader.register(shared, "weights")
    offloader.register([shared[:4], own], "adapters")
    saved = (shared.clone(), own.clone())
    pointer = shared.data_ptr()

    assert offloader.offload(offload_tags=["adapters"]).bytes == 8 * 4
    assert shared.untyped_storage().nbytes() == 16 * 4
    assert shared.data_ptr() == pointer
    assert own.untyped_storage().nbytes() == 0
    offloader.restore()
    assert torch.equal(shared, saved[0])
    assert torch.equal(own, saved[1])


def test_a_discard_mode_tag_named_to_copy_is_freed_and_comes_back_zero_filled() -> None:
    weights, cache = torch.randn(10), torch.randn(20)
    offloader = TorchOffloader()
    offloader.register(weights, "weights")
    offloader.register(cache, "cache", mode="discard")

    assert offloader.offload(offload_tags=["cache"]).bytes == 0
    assert cache.untyped_storage().nbytes() == 0
    assert weights.untyped_storage().nbytes() == 10 * 4
    assert offloader.restore().bytes == 0
    assert torch.count_nonzero(cache) == 0


def test_an_empty_list_copies_nothing_and_frees_only_the_discard_tags() -> None:
    offloader, tensors = three_parts()
    saved = {tag: t.clone() for tag, t in tensors.items()}

    assert offloader.offload(["kv_cache"], offload_tags=[]).bytes == 0
    assert tensors["kv_cache"].untyped_storage().nbytes() == 0
    assert torch.equal(tensors["weights"], saved["weights"])
    assert torch.equal(tensors["optimizer"], saved["optimizer"])
    offloader.restore()
    assert torch.count_nonzero(tensors["kv_cache"]) == 0


def test_a_repeat_moves_nothing_and_a_whole_offload_after_the_restore_moves_all() -> None:
    offloader, tensors = three_parts()
    saved = {tag: t.clone() for tag, t in tensors.items()}

    assert offloader.offload(offload_tags=["weights"]).bytes == 64 * 4
    assert offloader.offload(offload_tags=["optimizer"]).bytes == 0  # parked already
    assert tensors["optimizer"].untyped_storage().nbytes() == 128 * 4
    assert offloader.restore().bytes == 64 * 4
    assert offloader.restore().bytes == 0

    assert offloader.offload().bytes == (64 + 128 + 32) * 4
    assert all(t.untyped_storage().nbytes() == 0 for t in tensors.values())
    offloader.restore()
    assert all(torch.equal(tensors[tag], saved[tag]) for tag in tensors)


def test_a_storage_that_cannot_be_freed_blocks_only_an_offload_that_moves_its_tag() -> None:
    import numpy

    weights = torch.randn(12)
    late: list[torch.Tensor] = [torch.randn(6)]
    offloader = TorchOffloader()
    offloader.register(weights, "weights")
    offloader.register(late, "optimizer")
    late.append(torch.from_numpy(numpy.ones(4, dtype=numpy.float32)))  # appeared since
    saved = (weights.clone(), late[0].clone())

    with pytest.raises(FailedPreconditionError, match=r"optimizer: \[1\]"):
        offloader.offload(offload_tags=["optimizer"])
    assert not offloader.offloaded
    assert torch.equal(weights, saved[0])
    assert torch.equal(late[0], saved[1])

    assert offloader.offload(offload_tags=["weights"]).bytes == 12 * 4
    assert late[0].untyped_storage().nbytes() == 6 * 4
    offloader.restore()
    assert torch.equal(weights, saved[0])
