"""The `cuda` backend: the CUDA driver's checkpoint API, called from the long-lived agent.

`cuda.bindings.driver.cuCheckpointProcessLock / Checkpoint / Restore / Unlock / GetState`
(driver r570+, CUDA 12.8+). The driver copies a locked process's device memory into host
memory it keeps inside that process and releases the GPU; restore brings it back to the
same addresses. The agent calls `cuInit` once (restore needs it, or persistence mode).
Calling from a process that has initialised CUDA costs milliseconds; exec'ing the
`cuda-checkpoint` binary per call costs seconds (see `cuda_checkpoint.py`).

Driver calls block, so they run in worker threads, one in flight per process; a call still
running when its deadline passes is waited for before any later call on the same process.
The sequence and its rollback live in `_checkpoint.py`; the driver calls in
`_cuda_driver.py`, the custom-storage path (below) in `_cuda_storage.py`.

Copies. Up to driver 580 the driver copies through its own pageable staging (2-5 GB/s
measured on an H200). Where it offers custom storage (CUDA 13.4: `customStorageInfo_out`
in the checkpoint/restore arguments, then `cuCheckpointOperationComplete`), the agent maps
the process's memory and copies it itself through its pinned ring (`_ring.py`) into a
folder of its own (`store_dir`, a tmpfs: host memory that outlives an agent restart). The
driver offers no abort of a custom-storage operation, so a failed chunk of a snapshot is
rolled back by a round trip: the chunks the store lacks are copied into agent memory, the
operation is completed, and the process is restored from those bytes (then unlocked by the
mover). A failed chunk of a restore completes the operation and parks the process again
without copying: the stored copy was never touched.

Options (agent-level, or per group in `backend_options`): `lock_timeout_ms` (10000),
`rollback_seconds` (60); agent-level only: `threads` (16), `copy` (auto: custom storage
where offered | driver | custom: refuse without it), `chunk_bytes` (64MiB), `ring_buffers`
(4), `pinned_pool_bytes` (1GiB: the node's pinned pool), `host_reserve_bytes` (1GiB, the
agent's reserve), `store_dir` (/dev/shm/rlslice-cuda/<node>).
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any, ClassVar

import psutil

from rlslice.snapshot_agent.backends import _ring
from rlslice.snapshot_agent.backends._checkpoint import CheckpointMover, MoverBackend, StepError
from rlslice.snapshot_agent.backends._cuda_driver import (
    CUSTOM_STORAGE_SYMBOL,
    CUSTOM_STORAGE_VERSION,
    CUSTOM_SYMBOLS,
    MIN_CUDA_VERSION,
    MIN_DRIVER_MAJOR,
    SYMBOLS,
    Driver,
    copy_path,
)
from rlslice.snapshot_agent.backends._cuda_storage import (
    COPY_MODES,
    BindingsCopier,
    CudaOptions,
    CustomStorage,
    RingConfig,
    cuda_options,
    ring_config,
)
from rlslice.snapshot_agent.backends._nvml import Nvml, NvmlUnavailable
from rlslice.snapshot_agent.backends.base import (
    BackendContext,
    BackendError,
    JobHandle,
    ProbeResult,
)
from rlslice.units import format_bytes

__all__ = [
    "COPY_MODES",
    "CUSTOM_STORAGE_SYMBOL",
    "CUSTOM_STORAGE_VERSION",
    "CUSTOM_SYMBOLS",
    "MIN_CUDA_VERSION",
    "MIN_DRIVER_MAJOR",
    "SYMBOLS",
    "BindingsCopier",
    "CudaBackend",
    "CudaOptions",
    "CustomStorage",
    "Driver",
    "RingConfig",
    "copy_path",
    "cuda_options",
    "load_driver",
    "ring_config",
]


def load_driver() -> ModuleType:
    """`cuda.bindings.driver`; ImportError when cuda-python is not installed."""
    return importlib.import_module("cuda.bindings.driver")


class CudaBackend(MoverBackend):
    """Moves jobs with the CUDA driver checkpoint API (see the module docstring)."""

    name: ClassVar[str] = "cuda"

    def __init__(
        self,
        context: BackendContext,
        *,
        driver: Any | None = None,
        nvml: Nvml | None = None,
        host_memory: Callable[[], int] | None = None,
    ) -> None:
        self._context = context
        self._options = dict(context.options)
        self.options = cuda_options(self._options)
        """The agent-level options, validated."""
        self._module = driver
        self._driver: Driver | None = None
        self._nvml = nvml if nvml is not None else Nvml()
        self._mover: CheckpointMover | None = None
        self._host_memory = host_memory or (lambda: int(psutil.virtual_memory().available))
        self.ring = ring_config(self.options, context.node)
        self.pool = _ring.PinnedPool(
            limit=self.options.pinned_pool_bytes,
            chunk=self.ring.chunk,
            reserve=self.options.host_reserve_bytes,
            host_available=self._host_memory,
        )

    def _custom(self, driver: Driver) -> CustomStorage:
        custom = CustomStorage(self._module_or_load(), driver.check, self.pool, self.ring)
        self.pool.pending = custom.pending_bytes  # parked bytes still to come count too
        return custom

    def _module_or_load(self) -> Any:
        if self._module is None:
            try:
                self._module = load_driver()
            except ImportError as error:
                raise BackendError(
                    "cuda: cuda-python is not installed (pip install 'rlslice[cuda]')"
                ) from error
        return self._module

    def pinned_total(self) -> int:
        """Pinned staging bytes of the node's pool (the agent's `rlslice_agent_pinned_bytes`)."""
        return self.pool.total_bytes

    async def release(self, job: JobHandle) -> int:
        try:
            self._get_mover()  # after an agent restart the store may hold the job's copy
        except BackendError:
            return await super().release(job)
        if self._driver is not None and self._driver.custom is not None:
            for pid in job.pids:
                self._driver.custom.drop(pid)  # a copy parked in this agent's store
        return await super().release(job)

    def _get_mover(self) -> CheckpointMover:
        if self._mover is None:
            module = self._module_or_load()
            self._driver = Driver(module, threads=self.options.threads, custom=self._custom)
            self._mover = CheckpointMover(
                self._driver,
                self._nvml,
                state_dir=self._context.state_dir,
                backend=self.name,
                options=self._options,
            )
        return self._mover

    async def probe(self) -> ProbeResult:
        module = self._module
        if module is None:
            try:
                module = load_driver()
            except ImportError:
                return ProbeResult(
                    False, "cuda-python is not installed (pip install 'rlslice[cuda]')"
                )
        missing = [symbol for symbol in SYMBOLS if not hasattr(module, symbol)]
        if missing:
            return ProbeResult(
                False,
                f"cuda-python lacks {', '.join(missing)}: install cuda-bindings 12.8 or newer",
            )
        driver = Driver(module, threads=1)
        try:
            await asyncio.to_thread(driver.init)
            version = await asyncio.to_thread(driver.version)
        except StepError as error:
            return ProbeResult(False, f"cuInit failed: {error.reason}")
        except Exception as error:  # DynamicLibNotFoundError: no libcuda.so.1
            return ProbeResult(False, f"no NVIDIA driver: {str(error).splitlines()[0]}")
        finally:
            driver.close()
        if version < MIN_CUDA_VERSION:
            major, minor = divmod(version // 10, 100)
            return ProbeResult(
                False,
                f"the driver supports CUDA {major}.{minor}; the checkpoint API needs CUDA 12.8+ "
                f"(driver r{MIN_DRIVER_MAJOR}+)",
            )
        try:
            release = await asyncio.to_thread(self._nvml.driver_version)
        except NvmlUnavailable as error:
            return ProbeResult(False, f"NVML is needed to measure bytes: {error}")
        if int(release.split(".")[0]) < MIN_DRIVER_MAJOR:
            return ProbeResult(False, f"driver {release} is older than r{MIN_DRIVER_MAJOR}")
        ring, copies = copy_path(module, version, self.ring.mode)
        if ring:
            copies += (
                f": {self.ring.buffers} x {format_bytes(self.ring.chunk)} buffers per move, "
                f"node pool limit {format_bytes(self.pool.limit)}, store {self.ring.store}"
            )
        elif self.ring.mode == "custom":
            return ProbeResult(False, f"copy=custom, but {copies}")
        cuda = f"CUDA {version // 1000}.{version % 1000 // 10}"
        return ProbeResult(True, f"driver {release}, {cuda}; {copies}")
