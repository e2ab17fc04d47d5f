"""Park a PyTorch process's CUDA memory through torch-memory-saver, without `register` calls.

torch-memory-saver (`pip install torch-memory-saver`) interposes `cudaMalloc` / `cudaFree`
(preloaded: `LD_PRELOAD` names its hook library, see `preload_path`) and allocates through
CUDA virtual memory, so `pause()` can unmap the physical pages (copying them to host memory
when the region has `enable_cpu_backup=True`) and `resume()` map them back at the same
virtual addresses: tensors, views and captured CUDA graphs stay valid. It parks what was
allocated inside its `region()` contexts; the job opens one around its model, optimizer and
caches (one `with` in its setup, instead of a `register` per object). `expandable_segments`
must be off (the library refuses it); graphs must be captured through its `cuda_graph()`.

`MemorySaverOffloader` is the `Offloader` the offload loop drives: OFFLOAD pauses, RESTORE
resumes; bytes are the device memory freed and taken back (NVML, measured around the call).

Parts (issue 26): torch-memory-saver pauses by region tag, so one `MemorySaverOffloader`
moves its region tag (`tag=`), or every region (no tag; its tag reads "all"), whole. For
partial moves a job runs one per region tag (`[MemorySaverOffloader(tag="weights"),
MemorySaverOffloader(tag="optimizer")]`, the regions opened with those tags): the offload
loop pauses those whose tag a partial command names and leaves the others resident. With
no tag, a partial command naming other tags is refused: the transparent path moves whole.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from rlslice._errors import FailedPreconditionError
from rlslice.client.offload._http import nvml_used_bytes
from rlslice.client.offload._types import DISCARD, OFFLOAD, OffloadResult

#: The hook library torch-memory-saver preloads (`LD_PRELOAD`).
PRELOAD_LIBRARY = "torch_memory_saver_hook_mode_preload"


def load_saver() -> Any:
    """torch-memory-saver's process-wide saver; FailedPreconditionError when not installed."""
    try:
        from torch_memory_saver import torch_memory_saver  # type: ignore[import-not-found]
    except ImportError as error:
        raise FailedPreconditionError(
            f"torch-memory-saver is not installed ({error}): pip install torch-memory-saver"
        ) from None
    return torch_memory_saver


def preload_path() -> str:
    """The hook library to name in `LD_PRELOAD` for a job's processes."""
    try:
        from torch_memory_saver.utils import (  # type: ignore[import-not-found]
            get_binary_path_from_package,
        )
    except ImportError as error:
        raise FailedPreconditionError(
            f"torch-memory-saver is not installed ({error}): pip install torch-memory-saver"
        ) from None
    return str(get_binary_path_from_package(PRELOAD_LIBRARY))


class MemorySaverOffloader:
    """Pause and resume torch-memory-saver's regions on the agent's command."""

    def __init__(
        self,
        *,
        tag: str | None = None,
        cpu_backup: bool = True,
        saver: Any = None,
        measure: Callable[[], int | None] = nvml_used_bytes,
    ) -> None:
        """`tag`: the region tag to park (None: every region). `cpu_backup`: whether the
        regions were opened with `enable_cpu_backup=True` (contents survive: OFFLOAD);
        without it their memory is dropped and comes back uninitialised (DISCARD only)."""
        self._saver = saver if saver is not None else load_saver()
        self._tag = tag
        self._backup = cpu_backup
        self._measure = measure
        self._paused = False
        self._lock = threading.Lock()

    @property
    def modes(self) -> frozenset[str]:
        return frozenset({OFFLOAD, DISCARD}) if self._backup else frozenset({DISCARD})

    @property
    def tags(self) -> tuple[str, ...]:
        return (self._tag or "all",)

    def _timed(self, call: Callable[[], object], sign: int) -> OffloadResult:
        start = time.perf_counter()
        before = self._measure()
        call()
        after = self._measure()
        moved = max(0, sign * (before - after)) if before is not None and after is not None else 0
        return OffloadResult(bytes=moved, seconds=time.perf_counter() - start)

    def offload(self, discard_tags: Sequence[str] = ()) -> OffloadResult:
        del discard_tags  # the regions' backup setting decides what survives
        with self._lock:
            if self._paused:
                return OffloadResult(bytes=0, seconds=0.0)
            result = self._timed(lambda: self._saver.pause(self._tag), +1)
            self._paused = True
            return result

    def restore(self) -> OffloadResult:
        with self._lock:
            if not self._paused:
                return OffloadResult(bytes=0, seconds=0.0)
            result = self._timed(lambda: self._saver.resume(self._tag), -1)
            self._paused = False
            return result
