"""Fakes at the driver boundary only: `cuda.bindings.driver`, `pynvml`, the `cuda-checkpoint`
binary. Each keeps a per-process state machine with the driver's rules (lock only when
RUNNING, checkpoint only when LOCKED, ...), records every call, and fails or hangs where a
test asks it to."""

from __future__ import annotations

import ctypes
import enum
import json
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_NOT_INITIALIZED = 3
    CUDA_ERROR_ILLEGAL_STATE = 401
    CUDA_ERROR_NOT_FOUND = 500
    CUDA_ERROR_NOT_READY = 600
    CUDA_ERROR_NOT_SUPPORTED = 801


class CUprocessState(enum.IntEnum):
    CU_PROCESS_STATE_RUNNING = 0
    CU_PROCESS_STATE_LOCKED = 1
    CU_PROCESS_STATE_CHECKPOINTED = 2
    CU_PROCESS_STATE_FAILED = 3
    CU_PROCESS_STATE_CHECKPOINTING = 4
    CU_PROCESS_STATE_RESTORING = 5


R, L, C, F = (
    CUprocessState.CU_PROCESS_STATE_RUNNING,
    CUprocessState.CU_PROCESS_STATE_LOCKED,
    CUprocessState.CU_PROCESS_STATE_CHECKPOINTED,
    CUprocessState.CU_PROCESS_STATE_FAILED,
)

# op -> (state required, state after)
_RULES = {"lock": (R, L), "checkpoint": (L, C), "restore": (C, L), "unlock": (L, R)}


class CUcheckpointLockArgs:
    def __init__(self) -> None:
        self.timeoutMs = 0


class FakeDriver:
    """Stands in for the `cuda.bindings.driver` module: same names, same return shapes."""

    CUresult = CUresult
    CUprocessState = CUprocessState
    CUcheckpointLockArgs = CUcheckpointLockArgs

    def __init__(self, pids: dict[int, CUprocessState] | None = None, version: int = 12080) -> None:
        self.procs: dict[int, CUprocessState] = dict(pids or {})
        self.version = version
        self.calls: list[tuple[str, int]] = []
        self.lock_timeouts: list[int] = []
        self.init_calls = 0
        self.fail: dict[tuple[str, int], CUresult] = {}
        """(op, pid) -> error returned instead of doing it."""
        self.fail_nth: dict[int, CUresult] = {}
        """Nth checkpoint-API call (1-based, get-state excluded) -> error."""
        self.fail_state_after: dict[tuple[str, int], CUprocessState] = {}
        """Where a failed op leaves the process (default: unchanged)."""
        self.hang: dict[tuple[str, int], float] = {}
        """(op, pid) -> seconds the call blocks before it completes."""
        self._lock = threading.Lock()
        self._n = 0

    # module functions

    def cuInit(self, flags: int) -> tuple[CUresult]:
        self.init_calls += 1
        return (CUresult.CUDA_SUCCESS,)

    def cuDriverGetVersion(self) -> tuple[CUresult, int]:
        return (CUresult.CUDA_SUCCESS, self.version)

    def cuCheckpointProcessGetState(self, pid: int) -> tuple[CUresult, CUprocessState | None]:
        with self._lock:
            if pid not in self.procs:
                return (CUresult.CUDA_ERROR_INVALID_VALUE, None)
            return (CUresult.CUDA_SUCCESS, self.procs[pid])

    def cuCheckpointProcessGetRestoreThreadId(self, pid: int) -> tuple[CUresult, int]:
        return (CUresult.CUDA_SUCCESS, pid + 1)

    def _op(self, op: str, pid: int) -> tuple[CUresult]:
        with self._lock:
            self.calls.append((op, pid))
            self._n += 1
            n = self._n
        if (op, pid) in self.hang:
            time.sleep(self.hang[(op, pid)])
        with self._lock:
            error = self.fail.get((op, pid)) or self.fail_nth.get(n)
            if error is not None:
                if (op, pid) in self.fail_state_after:
                    self.procs[pid] = self.fail_state_after[(op, pid)]
                return (error,)
            if pid not in self.procs:
                return (CUresult.CUDA_ERROR_INVALID_VALUE,)
            need, after = _RULES[op]
            if self.procs[pid] is not need:
                return (CUresult.CUDA_ERROR_ILLEGAL_STATE,)
            self.procs[pid] = after
            return (CUresult.CUDA_SUCCESS,)

    def cuCheckpointProcessLock(
        self, pid: int, args: CUcheckpointLockArgs | None
    ) -> tuple[CUresult]:
        self.lock_timeouts.append(args.timeoutMs if args else 0)
        return self._op("lock", pid)

    def cuCheckpointProcessCheckpoint(self, pid: int, args: object) -> tuple[CUresult]:
        return self._op("checkpoint", pid)

    def cuCheckpointProcessRestore(self, pid: int, args: object) -> tuple[CUresult]:
        return self._op("restore", pid)

    def cuCheckpointProcessUnlock(self, pid: int, args: object) -> tuple[CUresult]:
        return self._op("unlock", pid)

    def ops_for(self, pid: int) -> list[str]:
        return [op for op, p in self.calls if p == pid]


class CUcheckpointCheckpointArgs:
    def __init__(self) -> None:
        self.customStorageInfo_out = 0


class CUcheckpointRestoreArgs:
    def __init__(self) -> None:
        self.gpuPairs = 0
        self.gpuPairsCount = 0
        self.customStorageInfo_out = 0


class _PerDevice(ctypes.Structure):
    _fields_ = (("devPtr", ctypes.c_uint64), ("size", ctypes.c_size_t), ("stream", ctypes.c_void_p))


class _Info(ctypes.Structure):
    _fields_ = (
        ("handle", ctypes.c_void_p),
        ("perDeviceData", ctypes.POINTER(_PerDevice)),
        ("deviceCount", ctypes.c_uint),
    )


CHECKPOINTING = CUprocessState.CU_PROCESS_STATE_CHECKPOINTING
RESTORING = CUprocessState.CU_PROCESS_STATE_RESTORING


class FakeCustomDriver(FakeDriver):
    """A CUDA 13.4 driver with custom storage: a custom-storage checkpoint maps the process's
    device memory (here: host buffers, one per GPU) into the caller, the caller copies it,
    and cuCheckpointOperationComplete finishes (CHECKPOINTED, the device copy overwritten
    with 0xEE so that only a real copy back restores it; restore: LOCKED). Every copy, event
    and pinned allocation is recorded in `log`; `fail_copy` fails the Nth async copy."""

    CUcheckpointCheckpointArgs = CUcheckpointCheckpointArgs
    CUcheckpointRestoreArgs = CUcheckpointRestoreArgs

    def __init__(self, memory: dict[int, list[bytes]], version: int = 13040) -> None:
        super().__init__(dict.fromkeys(memory, R), version=version)
        self.device = {
            pid: [ctypes.create_string_buffer(data, len(data)) for data in datas]
            for pid, datas in memory.items()
        }
        self.log: list[tuple[Any, ...]] = []
        self.fail_copy: dict[int, CUresult] = {}
        self.fail_sync_copy = False
        self.open_ops: dict[int, tuple[str, int, _Info, Any]] = {}
        self.pinned: dict[int, Any] = {}
        self.pin_calls = 0
        self._copies = 0
        self._handles = 1000

    def contents(self, pid: int) -> list[bytes]:
        return [buffer.raw for buffer in self.device[pid]]

    def _where(self, address: int) -> tuple[int, int, int]:
        for pid, buffers in self.device.items():
            for index, buffer in enumerate(buffers):
                base = ctypes.addressof(buffer)
                if base <= address < base + len(buffer):
                    return pid, index, address - base
        raise AssertionError(f"address {address:#x} is not mapped device memory")

    def _map(self, op: str, pid: int, out: int) -> CUresult:
        regions = (_PerDevice * len(self.device[pid]))()
        for index, buffer in enumerate(self.device[pid]):
            regions[index] = _PerDevice(ctypes.addressof(buffer), len(buffer), 7000 + index)
        self._handles += 1
        info = _Info(self._handles, regions, len(self.device[pid]))
        self.open_ops[self._handles] = (op, pid, info, regions)
        ctypes.c_void_p.from_address(out).value = ctypes.addressof(info)
        self.calls.append((op, pid))
        return CUresult.CUDA_SUCCESS

    def cuCheckpointProcessCheckpoint(self, pid: int, args: object) -> tuple[CUresult]:
        out = getattr(args, "customStorageInfo_out", 0)
        if not out:
            return super().cuCheckpointProcessCheckpoint(pid, args)
        if (error := self.fail.get(("checkpoint", pid))) is not None:
            return (error,)
        if self.procs.get(pid) is not L:
            return (CUresult.CUDA_ERROR_ILLEGAL_STATE,)
        self.procs[pid] = CHECKPOINTING
        return (self._map("checkpoint", pid, out),)

    def cuCheckpointProcessRestore(self, pid: int, args: object) -> tuple[CUresult]:
        out = getattr(args, "customStorageInfo_out", 0)
        if not out:
            return super().cuCheckpointProcessRestore(pid, args)
        if (error := self.fail.get(("restore", pid))) is not None:
            return (error,)
        if self.procs.get(pid) is not C:
            return (CUresult.CUDA_ERROR_ILLEGAL_STATE,)
        self.procs[pid] = RESTORING
        return (self._map("restore", pid, out),)

    def cuCheckpointOperationComplete(self, handle: int) -> tuple[CUresult]:
        op, pid, _, _ = self.open_ops.pop(int(handle))
        self.calls.append(("complete", pid))
        if op == "checkpoint":
            for buffer in self.device[pid]:
                ctypes.memset(buffer, 0xEE, len(buffer))  # released: the device copy is gone
            self.procs[pid] = C
        else:
            self.procs[pid] = L
        return (CUresult.CUDA_SUCCESS,)

    def _copy(self, kind: str, dst: int, src: int, nbytes: int, *, counted: bool) -> CUresult:
        pid, index, offset = self._where(src if kind.startswith("d2h") else dst)
        self.log.append((kind, pid, index, offset, nbytes, dst if kind.startswith("d2h") else src))
        if counted:
            self._copies += 1
            if (error := self.fail_copy.get(self._copies)) is not None:
                return error
        elif self.fail_sync_copy:
            return CUresult.CUDA_ERROR_NOT_READY
        ctypes.memmove(dst, src, nbytes)
        return CUresult.CUDA_SUCCESS

    def cuMemcpyDtoHAsync(self, dst: int, src: int, n: int, stream: int) -> tuple[CUresult]:
        return (self._copy("d2h", dst, src, n, counted=True),)

    def cuMemcpyHtoDAsync(self, dst: int, src: int, n: int, stream: int) -> tuple[CUresult]:
        return (self._copy("h2d", dst, src, n, counted=True),)

    def cuMemcpyDtoH(self, dst: int, src: int, n: int) -> tuple[CUresult]:
        return (self._copy("d2h-sync", dst, src, n, counted=False),)

    def cuMemHostAlloc(self, nbytes: int, flags: int) -> tuple[CUresult, int]:
        buffer = ctypes.create_string_buffer(nbytes)
        self.pinned[ctypes.addressof(buffer)] = buffer
        self.pin_calls += 1
        return (CUresult.CUDA_SUCCESS, ctypes.addressof(buffer))

    def cuMemFreeHost(self, pointer: int) -> tuple[CUresult]:
        del self.pinned[pointer]
        return (CUresult.CUDA_SUCCESS,)

    def cuEventCreate(self, flags: int) -> tuple[CUresult, int]:
        self._handles += 1
        return (CUresult.CUDA_SUCCESS, self._handles)

    def cuEventRecord(self, event: int, stream: int) -> tuple[CUresult]:
        self.log.append(("record", event))
        return (CUresult.CUDA_SUCCESS,)

    def cuEventSynchronize(self, event: int) -> tuple[CUresult]:
        self.log.append(("wait", event))
        return (CUresult.CUDA_SUCCESS,)

    def cuStreamSynchronize(self, stream: int) -> tuple[CUresult]:
        return (CUresult.CUDA_SUCCESS,)

    def cuStreamGetCtx(self, stream: int) -> tuple[CUresult, int]:
        return (CUresult.CUDA_SUCCESS, 1)

    def cuCtxSetCurrent(self, context: int) -> tuple[CUresult]:
        return (CUresult.CUDA_SUCCESS,)


class FakeNvml:
    """Stands in for `pynvml`: one device; processes that are parked vanish from the list,
    and the device's used memory drops by what they held."""

    def __init__(
        self,
        memory: dict[int, int | None],
        *,
        parked: Callable[[int], bool] = lambda pid: False,
        driver: str = "580.65.06",
        total: int = 80 << 30,
    ) -> None:
        self.memory = memory
        self.parked = parked
        self.driver = driver
        self.total = total
        self.base = 1 << 30  # other processes' use

    def nvmlInit(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return b"Fake H200"

    def _live(self) -> dict[int, int | None]:
        return {pid: used for pid, used in self.memory.items() if not self.parked(pid)}

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self._live().items()]

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        # Figures NVML cannot read per process still count on the device (here 1 GiB each).
        used = self.base + sum(v if v is not None else 1 << 30 for v in self._live().values())
        return SimpleNamespace(used=used, total=self.total, free=self.total - used)


# --- the cuda-checkpoint binary ----------------------------------------------------------

_SCRIPT = '''\
#!{python}
"""Fake cuda-checkpoint: state in $FAKE_CC_STATE (JSON), calls appended, failures and hangs
as the file says."""
import fcntl, json, os, sys, time

args = sys.argv[1:]
path = os.environ["FAKE_CC_STATE"]
if args == ["--help"]:
    print("CUDA checkpoint and restore utility.\\nVersion 580.65.06. Copyright (C) 2025")
    print("--action lock | checkpoint | restore | unlock --pid <pid> [--timeout <ms>]")
    sys.exit(0)
opts = dict(zip(args[::2], args[1::2])) if "--get-state" not in args else {{}}
if "--get-state" in args:
    op, pid = "get-state", args[args.index("--pid") + 1]
else:
    op, pid = opts["--action"], opts["--pid"]
rules = {{"lock": ("running", "locked"), "checkpoint": ("locked", "checkpointed"),
         "restore": ("checkpointed", "locked"), "unlock": ("locked", "running")}}
with open(path + ".lock", "w") as lk:
    fcntl.flock(lk, fcntl.LOCK_EX)
    state = json.load(open(path))
    if op != "get-state":
        state["calls"].append([op, int(pid)] + ([int(opts["--timeout"])] if "--timeout" in opts else []))
    hang = state.get("hang", {{}}).get(f"{{op}}:{{pid}}", 0)
    fail = state.get("fail", {{}}).get(f"{{op}}:{{pid}}")
    json.dump(state, open(path + ".tmp", "w")); os.replace(path + ".tmp", path)
if hang:
    time.sleep(hang)
with open(path + ".lock", "w") as lk:
    fcntl.flock(lk, fcntl.LOCK_EX)
    state = json.load(open(path))
    procs = state["procs"]
    if fail:
        print(f"Error: {{fail}}", file=sys.stderr); sys.exit(1)
    if pid not in procs:
        print(f"Error: process {{pid}} has no CUDA state", file=sys.stderr); sys.exit(1)
    if op == "get-state":
        print(procs[pid]); sys.exit(0)
    need, after = rules[op]
    if procs[pid] != need:
        print(f"Error: illegal state {{procs[pid]}}", file=sys.stderr); sys.exit(1)
    procs[pid] = after
    json.dump(state, open(path + ".tmp", "w")); os.replace(path + ".tmp", path)
'''


class FakeBinary:
    """Writes the fake `cuda-checkpoint` into a folder; its state lives in a JSON file."""

    def __init__(self, folder: Path, procs: dict[int, str]) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "cuda-checkpoint"
        self.path.write_text(textwrap.dedent(_SCRIPT.format(python=sys.executable)))
        self.path.chmod(0o755)
        self.state_path = folder / "state.json"
        self.write({"procs": {str(p): s for p, s in procs.items()}, "calls": []})

    def read(self) -> dict[str, Any]:
        return dict(json.loads(self.state_path.read_text()))

    def write(self, state: dict[str, Any]) -> None:
        self.state_path.write_text(json.dumps(state))

    def update(self, **changes: Any) -> None:
        state = self.read()
        state.update(changes)
        self.write(state)

    @property
    def calls(self) -> list[list[int | str]]:
        return list(self.read()["calls"])

    def state_of(self, pid: int) -> str:
        return str(self.read()["procs"][str(pid)])


@cache
def no_gpu_reason() -> str | None:
    """Why the `gpu` tests cannot run here, or None when a driver and a GPU answer."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return "cuda.bindings is not installed"
    try:
        (err,) = driver.cuInit(0)
    except Exception as error:  # no libcuda.so.1
        return f"cuda.bindings cannot reach a driver: {str(error).splitlines()[0]}"
    if err != driver.CUresult.CUDA_SUCCESS:
        return f"cuInit failed: {err.name}"
    err, count = driver.cuDeviceGetCount()
    if err != driver.CUresult.CUDA_SUCCESS or count == 0:
        return "the driver sees no GPU"
    return None
