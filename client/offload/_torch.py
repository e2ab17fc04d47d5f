"""Offload torch tensors to pinned host memory and back, in place.

Registered modules, optimizers and tensors are resolved to their storages at each offload
(optimizer state and gradients appear after registration). Each storage is copied into a
pinned host buffer in chunks on a side CUDA stream; once every copy is done, the storage is
resized to zero bytes and the caching allocator's free blocks go back to the driver. Restore
resizes each storage back and copies the bytes in. The storage objects are the same, so
every tensor, view and reference the training code holds stays valid, and the values are
bit-identical. DISCARD storages are freed without a copy and come back zero-filled.

A partial offload (`offload(offload_tags=[...])`, the agent's partial snapshot, issue 26)
moves only the storages of the tags it names: those are copied and freed, the discard tags
are freed without a copy, and every other tag stays resident, untouched. A storage reached
from a resident tag stays resident even when a moved tag reaches it too (freeing it would
pull memory from under the resident part). Its result counts the bytes copied only.

Only a storage torch lets resize can be freed in place: one shared with NumPy (`.numpy()`,
`torch.from_numpy`) or another foreign owner is refused at `register()` (and at an offload,
for optimizer state and gradients that appeared since), naming the tensor, before
anything moves.

Pinned buffers are kept between swaps (`keep_host_buffers`): pinning gigabytes takes far
longer than copying them. The kept pool is bounded (`pinned_limit_bytes`): past the limit,
buffers are freed after a restore instead of kept; `pinned_bytes` says what the process
holds, and the workload loop reports it to the agent (its host-memory guard counts it, and
its `rlslice_agent_pinned_bytes` gauge shows it). Without CUDA (CPU-only torch) the same logic runs on CPU
tensors with plain host buffers, so it can be tested anywhere.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlslice._errors import FailedPreconditionError, InvalidArgumentError
from rlslice.client.offload._types import MODES, OFFLOAD, OffloadResult

DEFAULT_CHUNK_BYTES = 64 << 20


@dataclass
class _Parked:
    storage: torch.UntypedStorage
    nbytes: int
    host: torch.Tensor | None  # None: discarded


def _flat(storage: torch.UntypedStorage) -> torch.Tensor:
    """A uint8 tensor over the whole storage (no copy)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def _named_tensors(obj: Any, prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
    """`_tensors`' walk with a name for each tensor (`layer.weight`, `state[3].exp_avg`)."""

    def join(name: str) -> str:
        return f"{prefix}.{name}" if prefix else name

    if isinstance(obj, torch.Tensor):
        yield prefix, obj
        if obj.grad is not None:
            yield join("grad"), obj.grad
    elif isinstance(obj, torch.nn.Module):
        for name, param in obj.named_parameters():
            yield from _named_tensors(param, join(name))
        for name, buffer in obj.named_buffers():
            yield join(name), buffer
    elif isinstance(obj, torch.optim.Optimizer):
        for index, state in enumerate(obj.state.values()):
            yield from _named_tensors(state, join(f"state[{index}]"))
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from _named_tensors(value, join(str(key)))
    elif isinstance(obj, list | tuple):
        for index, value in enumerate(obj):
            yield from _named_tensors(value, f"{prefix}[{index}]")


class TorchOffloader:
    """Moves registered torch state between the device and host memory on command.

    ```
    offloader = TorchOffloader()
    offloader.register(model, "weights")
    offloader.register(optimizer, "optimizer")
    offloader.register(kv_cache, "kv-cache", mode="discard")
    ```
    """

    splits_parts = True
    """Takes partial offloads (`offload_tags`): the workload loop hands it only its tags."""

    def __init__(
        self,
        *,
        device_type: str | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        keep_host_buffers: bool = True,
        pinned_limit_bytes: int | None = None,
    ) -> None:
        """`device_type`: which tensors move ("cuda" when torch sees a GPU, else "cpu", which
        only makes sense for tests). `chunk_bytes`: size of each copy. `pinned_limit_bytes`:
        most bytes of host buffers kept between swaps (None: no limit; 0, or
        `keep_host_buffers=False`: none kept)."""
        if chunk_bytes <= 0:
            raise InvalidArgumentError("chunk_bytes: must be positive")
        if pinned_limit_bytes is not None and pinned_limit_bytes < 0:
            raise InvalidArgumentError("pinned_limit_bytes: must be >= 0")
        self._device_type = device_type or ("cuda" if torch.cuda.is_available() else "cpu")
        self._cuda = self._device_type == "cuda"
        self._chunk = chunk_bytes
        self._keep = keep_host_buffers
        self._limit = pinned_limit_bytes
        self._registered: list[tuple[Any, str, str]] = []
        self._parked: list[_Parked] = []
        self._copied_only = False
        """Whether the parked state came from a partial offload (its bytes: those copied)."""
        self._pool: dict[int, list[torch.Tensor]] = {}
        self._lock = threading.Lock()

    # --- registration -----------------------------------------------------------------

    def register(self, obj: Any, tag: str, *, mode: str = OFFLOAD) -> None:
        """Register a module, an optimizer, a tensor, or a list/tuple/dict of them.

        `mode="discard"` drops the tag's memory at every offload (a KV cache); an
        "offload" tag is copied unless a command lists it in `discard_tags`.
        """
        if mode not in MODES:
            raise InvalidArgumentError(f"mode: {mode!r} is not one of {sorted(MODES)}")
        if not tag:
            raise InvalidArgumentError("tag: must not be empty")
        self._check_resizable(obj, tag)
        with self._lock:
            self._registered.append((obj, tag, mode))

    def _check_resizable(self, obj: Any, tag: str) -> None:
        """Refuse a tensor whose storage cannot be freed in place, naming it."""
        for name, tensor in _named_tensors(obj, ""):
            if tensor.device.type != self._device_type:
                continue
            storage = tensor.untyped_storage()
            if storage.nbytes() and not storage.resizable():
                where = f"{tag}: {name}" if name else tag
                raise FailedPreconditionError(
                    f"{where}: its storage cannot be resized (shared with NumPy through "
                    "`.numpy()` or `torch.from_numpy`?), so it cannot be offloaded in place; "
                    "give it a storage of its own first (`param.data = param.data.clone()`)"
                )

    @property
    def modes(self) -> frozenset[str]:
        return MODES

    @property
    def tags(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(tag for _, tag, _ in self._registered))

    @property
    def offloaded(self) -> bool:
        """Whether device state sits in host memory now."""
        return bool(self._parked)

    def _tensors(self, obj: Any) -> Iterator[torch.Tensor]:
        if isinstance(obj, torch.Tensor):
            yield obj
            if obj.grad is not None:
                yield obj.grad
        elif isinstance(obj, torch.nn.Module):
            for param in obj.parameters():
                yield from self._tensors(param)
            yield from obj.buffers()
        elif isinstance(obj, torch.optim.Optimizer):
            for state in obj.state.values():
                yield from self._tensors(list(state.values()))
        elif isinstance(obj, dict):
            for value in obj.values():
                yield from self._tensors(value)
        elif isinstance(obj, list | tuple):
            for value in obj:
                yield from self._tensors(value)

    def _plan(
        self, discard_tags: Iterable[str], offload_tags: Iterable[str] | None = None
    ) -> list[tuple[torch.UntypedStorage, bool]]:
        """Distinct storages on the device that move, each with whether to keep its bytes.

        Whole (`offload_tags` None): every registered storage moves. Partial: only those of
        `offload_tags` (kept) and `discard_tags` (dropped); the others stay resident. A
        storage reached from both a kept and a discarded tag is kept; one reached from a
        resident tag stays resident.
        """
        drop = set(discard_tags)
        chosen = None if offload_tags is None else set(offload_tags)
        plan: dict[int, tuple[torch.UntypedStorage, bool]] = {}
        resident: set[int] = set()
        for obj, tag, mode in self._registered:
            stays = chosen is not None and tag not in chosen and tag not in drop
            if not stays:
                self._check_resizable(obj, tag)  # state that appeared since registration
            keep = mode == OFFLOAD and tag not in drop
            for tensor in self._tensors(obj):
                if tensor.device.type != self._device_type:
                    continue
                storage = tensor.untyped_storage()
                if storage.nbytes() == 0:
                    continue
                key = storage.data_ptr()
                if stays:
                    resident.add(key)
                    continue
                plan[key] = (storage, keep or (key in plan and plan[key][1]))
        return [entry for key, entry in plan.items() if key not in resident]

    # --- moving -----------------------------------------------------------------------

    def _host_buffer(self, nbytes: int) -> torch.Tensor:
        pooled = self._pool.get(nbytes)
        if pooled:
            return pooled.pop()
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=self._cuda)

    def _side_stream(self, streams: dict[torch.device, Any], device: torch.device) -> Any:
        if not self._cuda:
            return None
        if device not in streams:
            stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
            stream.wait_stream(torch.cuda.current_stream(device))  # pending work first
            streams[device] = stream
        return streams[device]

    def _copy(self, dst: torch.Tensor, src: torch.Tensor, stream: Any) -> None:
        if stream is None:
            for start in range(0, src.numel(), self._chunk):
                dst[start : start + self._chunk].copy_(src[start : start + self._chunk])
            return
        with torch.cuda.stream(stream):
            for start in range(0, src.numel(), self._chunk):
                dst[start : start + self._chunk].copy_(
                    src[start : start + self._chunk], non_blocking=True
                )

    def offload(
        self, discard_tags: Sequence[str] = (), *, offload_tags: Sequence[str] | None = None
    ) -> OffloadResult:
        """Copy kept storages to host memory, then free every planned storage.

        `offload_tags` None: everything registered moves (tags in `discard_tags`, and
        discard-mode tags, are freed without a copy); the bytes are all those freed. A
        sequence: a partial offload, only the storages of those tags are copied and freed,
        those of `discard_tags` freed, every other tag left resident (a storage reached
        from a resident tag and a moved one stays resident; a discard-mode tag named is
        freed, never copied); the bytes are those copied. All copies finish before anything
        is freed: a failure leaves the state as it was. A repeat while offloaded moves
        nothing; `restore` brings back only what was parked.
        """
        with self._lock:
            start = time.perf_counter()
            if self._parked:
                return OffloadResult(bytes=0, seconds=0.0)  # a repeat: already offloaded
            plan = self._plan(discard_tags, offload_tags)
            streams: dict[torch.device, Any] = {}
            parked: list[_Parked] = []
            try:
                for storage, keep in plan:
                    nbytes = storage.nbytes()
                    host = self._host_buffer(nbytes) if keep else None
                    parked.append(_Parked(storage, nbytes, host))
                    if host is not None:
                        self._copy(host, _flat(storage), self._side_stream(streams, storage.device))
                for stream in streams.values():
                    stream.synchronize()
            except BaseException:
                self._recycle(parked)
                raise
            for entry in parked:
                entry.storage.resize_(0)
            self._parked = parked
            self._copied_only = offload_tags is not None
            if self._cuda:
                torch.cuda.empty_cache()  # give the freed blocks back to the driver
            return OffloadResult(bytes=self._counted(parked), seconds=time.perf_counter() - start)

    def _counted(self, entries: Iterable[_Parked]) -> int:
        """The bytes a move reports: those copied after a partial offload, else all freed."""
        return sum(e.nbytes for e in entries if e.host is not None or not self._copied_only)

    def restore(self) -> OffloadResult:
        """Reallocate every parked storage and copy its bytes back (zeros for DISCARD)."""
        with self._lock:
            start = time.perf_counter()
            parked = self._parked
            resized: list[_Parked] = []
            try:
                for entry in parked:
                    entry.storage.resize_(entry.nbytes)
                    resized.append(entry)
                streams: dict[torch.device, Any] = {}
                for entry in parked:
                    stream = self._side_stream(streams, entry.storage.device)
                    flat = _flat(entry.storage)
                    if entry.host is None:
                        if stream is None:
                            flat.zero_()
                        else:
                            with torch.cuda.stream(stream):
                                flat.zero_()
                    else:
                        self._copy(flat, entry.host, stream)
                for device, stream in streams.items():
                    stream.synchronize()
                    torch.cuda.current_stream(device).wait_stream(stream)
            except BaseException:
                # Out of device memory, say: stay parked, whole, for a retry.
                for entry in resized:
                    entry.storage.resize_(0)
                raise
            self._parked = []
            self._recycle(parked)
            return OffloadResult(bytes=self._counted(parked), seconds=time.perf_counter() - start)

    def _pooled(self) -> int:
        return sum(b.numel() for buffers in self._pool.values() for b in buffers)

    def _recycle(self, entries: Iterable[_Parked]) -> None:
        """Keep host buffers for the next swap, within the limit; the rest are freed."""
        if not self._keep:
            return
        room = None if self._limit is None else self._limit - self._pooled()
        for entry in entries:
            if entry.host is None:
                continue
            if room is not None:
                if entry.nbytes > room:
                    continue  # freed when the last reference goes
                room -= entry.nbytes
            self._pool.setdefault(entry.nbytes, []).append(entry.host)

    @property
    def pinned_bytes(self) -> int:
        """Host buffer bytes this offloader holds now: the parked state's and the pool's."""
        with self._lock:
            parked = sum(e.host.numel() for e in self._parked if e.host is not None)
            return parked + self._pooled()

    def free_host_buffers(self) -> int:
        """Drop the pinned buffers kept for the next swap; bytes freed."""
        with self._lock:
            if self._parked:
                raise FailedPreconditionError("free_host_buffers: state is offloaded now")
            freed = self._pooled()
            self._pool.clear()
            return freed
