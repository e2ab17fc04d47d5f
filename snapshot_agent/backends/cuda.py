"""The `cuda` backend: the CUDA driver's checkpoint API, called from the long-lived agent.

`cuda.bindings.driver.cuCheckpointProcessLock / Checkpoint / Restore / Unlock / GetState`
(driver r570+, CUDA 12.8+). The driver copies a locked process's device memory into host
memory it keeps inside that process and releases the GPU; restore brings it back to the
same addresses. The agent calls `cuInit` once (restore needs it, or persistence mode).
Calling from a process that has initialised CUDA costs milliseconds; exec'ing the
`cuda-checkpoint` binary per call costs seconds (see `cuda_checkpoint.py`).

Driver calls block, so they run in worker threads, one in flight per process; a call still
running when its deadline passes is waited for before any later call on the same process.
The sequence and its rollback live in `_checkpoint.py`.

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
import concurrent.futures
import ctypes
import importlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar, TypeVar

import psutil

from rlslice.snapshot_agent.backends import _ring
from rlslice.snapshot_agent.backends._checkpoint import (
    CheckpointMover,
    MoverBackend,
    NotCudaProcess,
    ProcState,
    StepError,
)
from rlslice.snapshot_agent.backends._nvml import Nvml, NvmlUnavailable
from rlslice.snapshot_agent.backends.base import (
    BackendContext,
    BackendError,
    JobHandle,
    ProbeResult,
)
from rlslice.units import format_bytes, parse_size

T = TypeVar("T")

#: The driver functions this backend calls.
SYMBOLS = (
    "cuInit",
    "cuDriverGetVersion",
    "cuCheckpointProcessLock",
    "cuCheckpointProcessCheckpoint",
    "cuCheckpointProcessRestore",
    "cuCheckpointProcessUnlock",
    "cuCheckpointProcessGetState",
    "cuCheckpointProcessGetRestoreThreadId",
    "CUcheckpointLockArgs",
)
MIN_CUDA_VERSION = 12080  # CUDA 12.8, the r570 driver
MIN_DRIVER_MAJOR = 570
#: Custom storage (the caller copies device memory itself, on its own streams, then calls
#: cuCheckpointOperationComplete) came with CUDA 13.4.
CUSTOM_STORAGE_SYMBOL = "cuCheckpointOperationComplete"
CUSTOM_STORAGE_VERSION = 13040

# get-state answers for a process the driver has no CUDA state for. NOT_INITIALIZED can
# only be about the target: this process has called cuInit before asking.
_NOT_CUDA = frozenset(
    {"CUDA_ERROR_INVALID_VALUE", "CUDA_ERROR_NOT_INITIALIZED", "CUDA_ERROR_NOT_FOUND"}
)

_STATES = {
    "CU_PROCESS_STATE_RUNNING": ProcState.RUNNING,
    "CU_PROCESS_STATE_LOCKED": ProcState.LOCKED,
    "CU_PROCESS_STATE_CHECKPOINTED": ProcState.CHECKPOINTED,
    "CU_PROCESS_STATE_FAILED": ProcState.FAILED,
    "CU_PROCESS_STATE_CHECKPOINTING": ProcState.CHECKPOINTING,
    "CU_PROCESS_STATE_RESTORING": ProcState.RESTORING,
}


#: The driver calls of the custom-storage path (the agent's copies and its pinned ring).
CUSTOM_SYMBOLS = (
    CUSTOM_STORAGE_SYMBOL,
    "CUcheckpointCheckpointArgs",
    "CUcheckpointRestoreArgs",
    "cuMemcpyDtoHAsync",
    "cuMemcpyHtoDAsync",
    "cuMemcpyDtoH",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuStreamSynchronize",
    "cuStreamGetCtx",
    "cuCtxSetCurrent",
)
COPY_MODES = ("auto", "driver", "custom")


def copy_path(module: Any, version: int, mode: str = "auto") -> tuple[bool, str]:
    """Which copy path a node gets, and why: (the agent's pinned ring, detail).

    The driver copies through its own pageable staging unless it offers custom storage:
    every call of `CUSTOM_SYMBOLS` in the bindings and a driver for CUDA 13.4 or newer.
    `mode` "driver" keeps the driver's path even then (the bench's side-by-side run)."""
    major, minor = divmod(version // 10, 100)
    pageable = "copies: the driver's pageable staging"
    if missing := [name for name in CUSTOM_SYMBOLS if not hasattr(module, name)]:
        return False, (
            f"{pageable} (the bindings lack {', '.join(missing[:2])}"
            f"{' ...' if len(missing) > 2 else ''}: custom storage needs cuda-bindings and a "
            "driver for CUDA 13.4+)"
        )
    if version < CUSTOM_STORAGE_VERSION:
        return False, (
            f"{pageable} (the driver supports CUDA {major}.{minor}; custom storage needs 13.4+)"
        )
    if mode == "driver":
        return False, f"{pageable} (copy=driver; custom storage is offered, CUDA {major}.{minor})"
    return True, (
        f"copies: the agent's pinned ring through the driver's custom storage "
        f"(CUDA {major}.{minor})"
    )


def load_driver() -> ModuleType:
    """`cuda.bindings.driver`; ImportError when cuda-python is not installed."""
    return importlib.import_module("cuda.bindings.driver")


def _name(value: Any) -> str:
    return str(getattr(value, "name", value))


class _PerDevice(ctypes.Structure):
    """CUcheckpointCustomStoragePerDeviceData, as cuda.h 13.4 lays it out."""

    _fields_ = (("devPtr", ctypes.c_uint64), ("size", ctypes.c_size_t), ("stream", ctypes.c_void_p))


class _StorageInfo(ctypes.Structure):
    """CUcheckpointCustomStorageInfo, as cuda.h 13.4 lays it out (allocated by the driver)."""

    _fields_ = (
        ("handle", ctypes.c_void_p),
        ("perDeviceData", ctypes.POINTER(_PerDevice)),
        ("deviceCount", ctypes.c_uint),
    )


def _wrap(module: Any, type_name: str, value: int) -> Any:
    """A raw handle as the bindings' type for it (CUstream, CUdeviceptr, ...), if they have one."""
    cls = getattr(module, type_name, None)
    return cls(value) if cls is not None else value


class BindingsCopier:
    """`_ring.Copier` over `cuda.bindings.driver`."""

    def __init__(self, module: Any, check: Callable[[str, int, Any], Any]) -> None:
        self._d = module
        self._check = check

    def _run(self, op: str, result: Any) -> Any:
        return self._check(op, 0, result)

    def d2h(self, host: int, device: int, nbytes: int, stream: Any) -> None:
        d = self._d
        self._run(
            "copy", d.cuMemcpyDtoHAsync(host, _wrap(d, "CUdeviceptr", device), nbytes, stream)
        )

    def h2d(self, device: int, host: int, nbytes: int, stream: Any) -> None:
        d = self._d
        self._run(
            "copy", d.cuMemcpyHtoDAsync(_wrap(d, "CUdeviceptr", device), host, nbytes, stream)
        )

    def d2h_sync(self, host: int, device: int, nbytes: int) -> None:
        d = self._d
        self._run("copy", d.cuMemcpyDtoH(host, _wrap(d, "CUdeviceptr", device), nbytes))

    def event(self) -> Any:
        return self._run("event", self._d.cuEventCreate(2))  # CU_EVENT_DISABLE_TIMING

    def record(self, event: Any, stream: Any) -> None:
        self._run("event", self._d.cuEventRecord(event, stream))

    def wait(self, event: Any) -> None:
        self._run("event", self._d.cuEventSynchronize(event))

    def sync(self, stream: Any) -> None:
        self._run("sync", self._d.cuStreamSynchronize(stream))

    def alloc_host(self, nbytes: int) -> int:
        return int(self._run("pin", self._d.cuMemHostAlloc(nbytes, 1)))  # PORTABLE

    def free_host(self, pointer: int) -> None:
        self._run("unpin", self._d.cuMemFreeHost(pointer))


@dataclass(frozen=True)
class RingConfig:
    """How the custom-storage path copies (the backend's agent-level options)."""

    mode: str
    chunk: int
    buffers: int
    store: Path


class CustomStorage:
    """The custom-storage checkpoint and restore of one process, through the pinned ring
    (see the module docstring). Runs in a worker thread; raises StepError."""

    def __init__(
        self,
        module: Any,
        check: Callable[[str, int, Any], Any],
        pool: _ring.PinnedPool,
        config: RingConfig,
    ) -> None:
        self._d = module
        self._check = check
        self.copier = BindingsCopier(module, check)
        self.pool = pool
        self.config = config
        self._pending = 0
        self._lock = threading.Lock()

    def pending_bytes(self) -> int:
        """Bytes snapshots under way still have to park (the pool's guard counts them)."""
        with self._lock:
            return self._pending

    def _folder(self, pid: int) -> Path:
        return self.config.store / str(pid)

    def parked(self, pid: int) -> bool:
        """Whether `pid`'s memory was parked through custom storage (its copy is here)."""
        return (self._folder(pid) / "meta.json").exists()

    def drop(self, pid: int) -> None:
        """Forget `pid`'s stored copy."""
        shutil.rmtree(self._folder(pid), ignore_errors=True)

    def _begin(self, op: str, pid: int, args_type: str) -> tuple[Any, list[_ring.Region]]:
        """Start a custom-storage operation: the driver maps the memory and says where."""
        d = self._d
        args = getattr(d, args_type)()
        out = ctypes.c_void_p(0)
        args.customStorageInfo_out = ctypes.addressof(out)
        call = (
            d.cuCheckpointProcessCheckpoint if op == "checkpoint" else d.cuCheckpointProcessRestore
        )
        self._check(op, pid, call(pid, args))
        if not out.value:
            raise StepError(op, pid, "the driver returned no custom-storage info")
        info = _StorageInfo.from_address(out.value)
        regions = [
            _ring.Region(
                int(info.perDeviceData[i].devPtr),
                int(info.perDeviceData[i].size),
                _wrap(d, "CUstream", int(info.perDeviceData[i].stream or 0)),
            )
            for i in range(info.deviceCount)
        ]
        return info.handle, regions

    def _complete(self, op: str, pid: int, handle: Any) -> None:
        d = self._d
        self._check(
            op,
            pid,
            d.cuCheckpointOperationComplete(_wrap(d, "CUcheckpointOperationHandle", handle)),
        )

    def _through_ring(
        self,
        copy: Callable[..., None],
        region: _ring.Region,
        data: Callable[[int, memoryview], None],
        timeout: float,
    ) -> None:
        """`copy` (`_ring.copy_out` or `copy_in`) of one region through leased buffers."""
        ctx = self._check("context", 0, self._d.cuStreamGetCtx(region.stream))
        self._check("context", 0, self._d.cuCtxSetCurrent(ctx))
        with self.pool.lease(self.config.buffers, self.copier, timeout=timeout) as buffers:
            copy(self.copier, region, buffers, self.config.chunk, data)

    def checkpoint(self, pid: int, deadline: float) -> None:
        """LOCKED -> CHECKPOINTED, the bytes in this agent's store."""
        handle, regions = self._begin("checkpoint", pid, "CUcheckpointCheckpointArgs")
        self.drop(pid)
        folder = self._folder(pid)
        folder.mkdir(parents=True)
        total = sum(r.size for r in regions)
        with self._lock:
            self._pending += total
        files: list[_ring.RegionFile] = []
        reached = 0
        try:
            for reached, region in enumerate(regions):
                file = _ring.RegionFile(folder / f"dev{reached}.bin", region.size, create=True)
                files.append(file)
                self._through_ring(_ring.copy_out, region, file.write, deadline - time.time())
        except (_ring.ChunkError, TimeoutError, OSError) as error:
            self._roll_back_checkpoint(pid, handle, regions, files, reached, error)
        finally:
            with self._lock:
                self._pending -= total
            for file in files:
                file.close()
        self._complete("checkpoint", pid, handle)
        meta = {"sizes": [r.size for r in regions], "chunk": self.config.chunk}
        (folder / "meta.tmp").write_text(json.dumps(meta))
        os.replace(folder / "meta.tmp", folder / "meta.json")

    def _roll_back_checkpoint(
        self,
        pid: int,
        handle: Any,
        regions: list[_ring.Region],
        files: list[_ring.RegionFile],
        failed_at: int,
        error: BaseException,
    ) -> None:
        """The round trip back to LOCKED after a failed chunk (no abort exists): rescue what
        the store lacks, complete, restore from store + rescue. Always raises StepError."""
        reason = f"custom storage: {error}"
        chunk = self.config.chunk
        stored = error.stored if isinstance(error, _ring.ChunkError) else frozenset()
        try:
            kept = [
                _ring.rescue(self.copier, region, chunk, stored if i == failed_at else frozenset())
                if i >= failed_at
                else {}
                for i, region in enumerate(regions)
            ]
        except Exception as rescue_error:
            raise StepError(
                "checkpoint",
                pid,
                f"{reason}; the rescue copy failed too ({rescue_error}): the "
                "operation is left open, the process stays CHECKPOINTING",
            ) from error
        self._complete("checkpoint", pid, handle)
        back, again = self._begin("restore", pid, "CUcheckpointRestoreArgs")
        staging = ctypes.create_string_buffer(chunk)  # pageable: the pool may be what failed
        for i, region in enumerate(again):

            def load(offset: int, into: memoryview, i: int = i) -> None:
                if offset in kept[i]:
                    into[:] = kept[i][offset]
                else:  # stored: regions before the failed one, and its stored chunks
                    files[i].read(offset, into)

            _ring.copy_in(
                self.copier,
                region,
                [ctypes.addressof(staging)],
                chunk,
                load,
            )
        self._complete("restore", pid, back)
        self.drop(pid)
        raise StepError("checkpoint", pid, f"{reason}; copied back, the process is locked")

    def restore(self, pid: int, deadline: float) -> None:
        """CHECKPOINTED (parked here) -> LOCKED, the stored copy dropped."""
        folder = self._folder(pid)
        sizes = json.loads((folder / "meta.json").read_text())["sizes"]
        handle, regions = self._begin("restore", pid, "CUcheckpointRestoreArgs")
        try:
            if [r.size for r in regions] != sizes:
                raise OSError(f"the driver maps {[r.size for r in regions]} bytes, {sizes} stored")
            for index, region in enumerate(regions):
                file = _ring.RegionFile(folder / f"dev{index}.bin", region.size, create=False)
                try:
                    self._through_ring(_ring.copy_in, region, file.read, deadline - time.time())
                finally:
                    file.close()
        except (_ring.ChunkError, TimeoutError, OSError) as error:
            # No abort: complete (LOCKED, memory partly copied), then park again without
            # copying: the stored copy is intact and stays the job's state.
            self._complete("restore", pid, handle)
            again, _ = self._begin("checkpoint", pid, "CUcheckpointCheckpointArgs")
            self._complete("checkpoint", pid, again)
            raise StepError(
                "restore", pid, f"custom storage: {error}; parked again, the stored copy is intact"
            ) from error
        self._complete("restore", pid, handle)
        self.drop(pid)


class Driver:
    """The checkpoint calls of a `cuda.bindings.driver` module, checked and threaded."""

    def __init__(
        self,
        module: Any,
        *,
        threads: int = 16,
        custom: Callable[[Driver], CustomStorage] | None = None,
    ) -> None:
        self._d = module
        self.custom = custom(self) if custom is not None else None
        self._custom_on: bool | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix="rlslice-cuda"
        )
        self._init_lock = threading.Lock()
        self._initialised = False
        self._inflight: dict[int, asyncio.Future[Any]] = {}

    def _check(self, op: str, pid: int, result: Any) -> Any:
        err, *rest = result if isinstance(result, tuple) else (result,)
        if _name(err) != "CUDA_SUCCESS":
            cls = NotCudaProcess if op == "get-state" and _name(err) in _NOT_CUDA else StepError
            raise cls(op, pid, _name(err))
        return rest[0] if rest else None

    def init(self) -> None:
        """cuInit(0), once: restore needs it in the caller (or persistence mode)."""
        with self._init_lock:
            if not self._initialised:
                self._check("cuInit", 0, self._d.cuInit(0))
                self._initialised = True

    def version(self) -> int:
        """The CUDA version the driver supports, e.g. 12080."""
        return int(self._check("cuDriverGetVersion", 0, self._d.cuDriverGetVersion()))

    def check(self, op: str, pid: int, result: Any) -> Any:
        """The result of a driver call, or StepError."""
        return self._check(op, pid, result)

    def uses_custom(self) -> bool:
        """Whether snapshots copy through the agent's ring (asked once, in a worker thread)."""
        if self.custom is None:
            return False
        if self._custom_on is None:
            mode = self.custom.config.mode
            offered, detail = copy_path(self._d, self.version(), mode)
            if mode == "custom" and not offered:
                raise StepError("checkpoint", 0, f"copy=custom, but {detail}")
            self._custom_on = offered
        return self._custom_on

    async def _call(self, pid: int, deadline: float, fn: Callable[[], T]) -> T:
        loop = asyncio.get_running_loop()
        previous = self._inflight.get(pid)
        if previous is not None and not previous.done():
            # A call that ran past its deadline may still finish: never overlap two calls
            # on one process.
            await asyncio.wait_for(asyncio.shield(previous), max(0.0, deadline - time.time()))

        def run() -> T:
            self.init()
            return fn()

        remaining = deadline - time.time()
        if remaining <= 0:
            raise TimeoutError(f"deadline passed before calling the driver for pid {pid}")
        future = loop.run_in_executor(self._pool, run)
        self._inflight[pid] = future
        try:
            return await asyncio.wait_for(asyncio.shield(future), remaining)
        except TimeoutError as error:
            raise TimeoutError(
                f"driver call for pid {pid} still running at the deadline"
            ) from error

    async def get_state(self, pid: int, *, deadline: float) -> ProcState:
        d = self._d
        state = await self._call(
            pid,
            deadline,
            lambda: self._check("get-state", pid, d.cuCheckpointProcessGetState(pid)),
        )
        try:
            return _STATES[_name(state)]
        except KeyError as error:
            raise StepError("get-state", pid, f"unknown state {_name(state)}") from error

    async def lock(self, pid: int, *, timeout_ms: int, deadline: float) -> None:
        d = self._d

        def lock() -> None:
            args = d.CUcheckpointLockArgs()
            args.timeoutMs = timeout_ms
            self._check("lock", pid, d.cuCheckpointProcessLock(pid, args))

        await self._call(pid, deadline, lock)

    async def checkpoint(self, pid: int, *, deadline: float) -> None:
        d = self._d

        def checkpoint() -> None:
            if self.custom is not None and self.uses_custom():
                self.custom.checkpoint(pid, deadline)
            else:
                self._check("checkpoint", pid, d.cuCheckpointProcessCheckpoint(pid, None))

        await self._call(pid, deadline, checkpoint)

    async def restore(self, pid: int, *, deadline: float) -> None:
        d = self._d

        def restore() -> None:
            if self.custom is not None and self.custom.parked(pid):
                self.custom.restore(pid, deadline)  # parked through the ring: back the same way
                return
            try:
                self._check("restore", pid, d.cuCheckpointProcessRestore(pid, None))
            except StepError as error:
                # The restore thread id helps find the process's driver-side log lines.
                tid = d.cuCheckpointProcessGetRestoreThreadId(pid)
                if _name(tid[0]) == "CUDA_SUCCESS":
                    raise StepError(
                        "restore", pid, f"{error.reason} (restore tid {tid[1]})"
                    ) from error
                raise

        await self._call(pid, deadline, restore)

    async def unlock(self, pid: int, *, deadline: float) -> None:
        d = self._d
        await self._call(
            pid,
            deadline,
            lambda: self._check("unlock", pid, d.cuCheckpointProcessUnlock(pid, None)),
        )

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.custom is not None:
            self.custom.pool.close()


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
        self._module = driver
        self._driver: Driver | None = None
        self._nvml = nvml if nvml is not None else Nvml()
        self._mover: CheckpointMover | None = None
        self._host_memory = host_memory or (lambda: int(psutil.virtual_memory().available))
        self.ring = ring_config(self._options, context.node)
        self.pool = _ring.PinnedPool(
            limit=_size_option(self._options, "pinned_pool_bytes", _ring.DEFAULT_POOL_BYTES),
            chunk=self.ring.chunk,
            reserve=_size_option(self._options, "host_reserve_bytes", 1 << 30),
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
            self._driver = Driver(
                module, threads=int(self._options.get("threads", "16")), custom=self._custom
            )
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


def _size_option(options: dict[str, str], key: str, default: int) -> int:
    raw = options.get(key)
    if raw is None:
        return default
    try:
        value = parse_size(raw)
    except ValueError as error:
        raise BackendError(f"cuda: option {key}: {error}") from error
    if value < 0:
        raise BackendError(f"cuda: option {key}: must be >= 0")
    return value


def ring_config(options: dict[str, str], node: str) -> RingConfig:
    """The custom-storage path's options (see the module docstring)."""
    mode = options.get("copy", "auto")
    if mode not in COPY_MODES:
        raise BackendError(f"cuda: option copy: {mode!r} is not one of {', '.join(COPY_MODES)}")
    chunk = _size_option(options, "chunk_bytes", _ring.DEFAULT_CHUNK_BYTES)
    buffers = int(options.get("ring_buffers", str(_ring.DEFAULT_RING_BUFFERS)))
    if chunk <= 0 or buffers <= 0:
        raise BackendError("cuda: options chunk_bytes and ring_buffers must be positive")
    store = Path(options.get("store_dir") or f"/dev/shm/rlslice-cuda/{node}")
    return RingConfig(mode, chunk, buffers, store)
