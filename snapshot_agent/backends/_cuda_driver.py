"""The `cuda` backend's driver calls: `cuda.bindings.driver`, checked and threaded.

Which driver functions the backend needs, which copy path a node gets (`copy_path`), and
`Driver`: the checkpoint calls, each run in a worker thread, one in flight per process.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from rlslice.snapshot_agent.backends._checkpoint import NotCudaProcess, ProcState, StepError
from rlslice.snapshot_agent.backends._cuda_storage import CustomStorage

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


def _name(value: Any) -> str:
    return str(getattr(value, "name", value))


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
