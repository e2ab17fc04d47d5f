"""The `cuda` backend's custom-storage path: the agent copies device memory itself.

Where the driver offers custom storage (CUDA 13.4), it maps a locked process's memory and
the agent copies it through its pinned ring (`_ring.py`) into its store folder, then calls
`cuCheckpointOperationComplete`; a failed chunk is rolled back by a round trip (see the
`cuda` module's docstring). Here: the driver's structures as cuda.h lays them out, the ring's
copier over the bindings, the ring's options, and `CustomStorage`, which runs one process's
checkpoint or restore in a worker thread.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from rlslice.snapshot_agent.backends import _options, _ring
from rlslice.snapshot_agent.backends._checkpoint import StepError
from rlslice.snapshot_agent.backends.base import BackendError
from rlslice.units import parse_size

COPY_MODES = ("auto", "driver", "custom")


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


def _size(value: object) -> object:
    return parse_size(value) if isinstance(value, str) else value


Size = Annotated[int, BeforeValidator(_size), Field(ge=0)]
"""Bytes: `1073741824`, `1GiB`, `512MiB`, `2G`."""


class CudaOptions(BaseModel):
    """The `cuda` backend's agent-level options (see the `cuda` module docstring)."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    copy_mode: Literal["auto", "driver", "custom"] = Field("auto", alias="copy")
    """auto: custom storage where offered; driver; custom: refuse without it."""
    chunk_bytes: Annotated[int, BeforeValidator(_size), Field(gt=0)] = _ring.DEFAULT_CHUNK_BYTES
    ring_buffers: Annotated[int, Field(gt=0)] = _ring.DEFAULT_RING_BUFFERS
    store_dir: str = ""
    """Where parked copies are kept (empty: /dev/shm/rlslice-cuda/<node>)."""
    pinned_pool_bytes: Size = _ring.DEFAULT_POOL_BYTES
    """The node's pinned pool."""
    host_reserve_bytes: Size = 1 << 30
    """The agent's host reserve."""
    threads: Annotated[int, Field(gt=0)] = 16


def cuda_options(options: Mapping[str, str]) -> CudaOptions:
    """The agent-level options; a malformed one is a BackendError naming it."""
    return _options.parse(CudaOptions, options, error=BackendError, what="cuda: option ")


def ring_config(options: CudaOptions, node: str) -> RingConfig:
    """The custom-storage path's options (see the module docstring)."""
    store = Path(options.store_dir or f"/dev/shm/rlslice-cuda/{node}")
    return RingConfig(options.copy_mode, options.chunk_bytes, options.ring_buffers, store)
