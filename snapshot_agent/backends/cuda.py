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

Options (agent-level, or per group in `backend_options`): `lock_timeout_ms` (10000),
`rollback_seconds` (60); agent-level only: `threads` (16).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any, ClassVar, TypeVar

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
    ProbeResult,
)

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


def copy_path(module: Any, version: int) -> tuple[bool, str]:
    """Which copy path a node's driver allows, and why: (custom storage offered, detail).

    The driver copies through its own pageable staging (2-5 GB/s measured on an H200,
    driver 580) unless it offers custom storage: `cuCheckpointOperationComplete` in the
    bindings and a driver for CUDA 13.4 or newer. This build still takes the driver's path
    where custom storage is offered: the agent's own pinned ring is not built yet."""
    major, minor = divmod(version // 10, 100)
    if not hasattr(module, CUSTOM_STORAGE_SYMBOL):
        return False, (
            f"copies: the driver's pageable staging (the bindings lack {CUSTOM_STORAGE_SYMBOL}: "
            "custom storage needs cuda-bindings and a driver for CUDA 13.4+)"
        )
    if version < CUSTOM_STORAGE_VERSION:
        return False, (
            f"copies: the driver's pageable staging (the driver supports CUDA {major}.{minor}; "
            "custom storage needs 13.4+)"
        )
    return True, (
        f"copies: the driver's pageable staging; custom storage is offered (CUDA {major}.{minor}) "
        "but the agent's pinned-ring copy is not built yet"
    )


def load_driver() -> ModuleType:
    """`cuda.bindings.driver`; ImportError when cuda-python is not installed."""
    return importlib.import_module("cuda.bindings.driver")


def _name(value: Any) -> str:
    return str(getattr(value, "name", value))


class Driver:
    """The checkpoint calls of a `cuda.bindings.driver` module, checked and threaded."""

    def __init__(self, module: Any, *, threads: int = 16) -> None:
        self._d = module
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
        await self._call(
            pid,
            deadline,
            lambda: self._check("checkpoint", pid, d.cuCheckpointProcessCheckpoint(pid, None)),
        )

    async def restore(self, pid: int, *, deadline: float) -> None:
        d = self._d

        def restore() -> None:
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


class CudaBackend(MoverBackend):
    """Moves jobs with the CUDA driver checkpoint API (see the module docstring)."""

    name: ClassVar[str] = "cuda"

    def __init__(
        self,
        context: BackendContext,
        *,
        driver: Any | None = None,
        nvml: Nvml | None = None,
    ) -> None:
        self._context = context
        self._options = dict(context.options)
        self._module = driver
        self._driver: Driver | None = None
        self._nvml = nvml if nvml is not None else Nvml()
        self._mover: CheckpointMover | None = None

    def _get_mover(self) -> CheckpointMover:
        if self._mover is None:
            module = self._module
            if module is None:
                try:
                    module = load_driver()
                except ImportError as error:
                    raise BackendError(
                        "cuda: cuda-python is not installed (pip install 'rlslice[cuda]')"
                    ) from error
            self._driver = Driver(module, threads=int(self._options.get("threads", "16")))
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
        _, copies = copy_path(module, version)
        cuda = f"CUDA {version // 1000}.{version % 1000 // 10}"
        return ProbeResult(True, f"driver {release}, {cuda}; {copies}")
