"""`TorchOffloader` refuses a tensor it cannot free in place, naming it, before anything moves.

A storage shared with NumPy (`.numpy()`, `torch.from_numpy`) is marked not resizable by
torch: offloading it would copy it out, then fail at the resize and roll back at every
switch. CPU tensors stand in for device ones (`device_type="cpu"`).

Cases:
- a module with one such parameter is refused at `register()`: the message names the tag
  and the parameter; nothing is registered;
- a bare tensor from `torch.from_numpy` is refused by its tag;
- optimizer state that became unresizable after registration is refused at the offload,
  named, with every tensor left as it was; after the fix (a storage of its own) it moves;
- an ordinary module registers and round-trips bit-identically.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rlslice._errors import FailedPreconditionError  # noqa: E402
from rlslice.client.offload import TorchOffloader  # noqa: E402


def offloader() -> TorchOffloader:
    return TorchOffloader(device_type="cpu")


def test_a_module_with_a_numpy_shared_parameter_is_refused_by_name() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    model[1].weight.detach().numpy()  # torch pins this storage for good
    moves = offloader()
    with pytest.raises(FailedPreconditionError, match=r"weights: 1\.weight: .*cannot be resized"):
        moves.register(model, "weights")
    assert moves.tags == ()


def test_a_tensor_from_numpy_is_refused_by_its_tag() -> None:
    with pytest.raises(FailedPreconditionError, match=r"^kv: its storage cannot be resized"):
        offloader().register(torch.from_numpy(np.zeros(8, dtype=np.float32)), "kv")


def test_optimizer_state_that_appears_unresizable_is_refused_at_the_offload() -> None:
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.Adam(model.parameters())
    moves = offloader()
    moves.register(model, "weights")
    moves.register(optimizer, "optimizer")  # no state yet
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    moment = optimizer.state[model.weight]["exp_avg"]
    moment.numpy()
    before = {name: p.clone() for name, p in model.named_parameters()}
    with pytest.raises(FailedPreconditionError, match=r"optimizer: state\[0\]\.exp_avg"):
        moves.offload()
    assert not moves.offloaded
    for name, param in model.named_parameters():
        assert torch.equal(param, before[name])  # nothing moved, nothing freed
    optimizer.state[model.weight]["exp_avg"] = moment.clone()  # a storage of its own
    assert moves.offload().bytes > 0
    moves.restore()
    assert torch.equal(model.weight, before["weight"])


def test_an_ordinary_module_round_trips_bit_identically() -> None:
    model = torch.nn.Linear(8, 8)
    saved = model.weight.detach().clone()
    moves = offloader()
    moves.register(model, "weights")
    assert moves.offload().bytes == (8 * 8 + 8) * 4
    assert model.weight.untyped_storage().nbytes() == 0
    moves.restore()
    assert torch.equal(model.weight, saved)
