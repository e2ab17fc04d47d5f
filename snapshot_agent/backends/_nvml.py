"""A thin NVML adapter: driver version, per-process device memory, per-device usage.

The GPU backends measure bytes with it (per-process used memory before a snapshot) and
report devices through it. It wraps `pynvml` (the `nvidia-ml-py` distribution); tests hand
in a fake module with the same functions. NVML calls are short, but they still block, so
the async helpers run them in a thread.
"""

from __future__ import annotations

import asyncio
import importlib
import threading
from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import Any

from rlslice.snapshot_agent.backends.base import DeviceUsage


class NvmlUnavailable(Exception):
    """NVML cannot be used here (module missing, no driver); the message says which."""


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Nvml:
    """NVML through `pynvml` (or an injected module with the same functions).

    Initialised on first use; every method raises `NvmlUnavailable` with a one-line reason
    when NVML cannot be used.
    """

    def __init__(self, module: ModuleType | Any | None = None) -> None:
        self._module = module
        self._ready = False
        self._lock = threading.Lock()

    def _nvml(self) -> Any:
        with self._lock:
            if self._ready:
                return self._module
            module = self._module
            if module is None:
                try:
                    module = importlib.import_module("pynvml")
                except ImportError as error:
                    raise NvmlUnavailable(
                        "pynvml is not installed (pip install 'rlslice[cuda]')"
                    ) from error
            try:
                module.nvmlInit()
            except Exception as error:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
                raise NvmlUnavailable(f"NVML cannot start: {error}") from error
            self._module = module
            self._ready = True
            return module

    def driver_version(self) -> str:
        """The display driver's version, e.g. "580.65.06"."""
        return _text(self._nvml().nvmlSystemGetDriverVersion())

    def driver_major(self) -> int:
        """The driver's major version (570, 580, ...)."""
        return int(self.driver_version().split(".", 1)[0])

    def _handles(self) -> list[Any]:
        nvml = self._nvml()
        return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]

    def process_bytes(self, pids: Iterable[int]) -> dict[int, int | None]:
        """Device memory each of `pids` uses, summed over devices.

        A pid NVML does not list is absent from the answer; a pid NVML lists without a
        figure (no permission to read it, as in some containers) maps to None.
        """
        wanted = set(pids)
        nvml = self._nvml()
        found: dict[int, int | None] = {}
        for handle in self._handles():
            for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid not in wanted:
                    continue
                used = proc.usedGpuMemory
                if used is None or (proc.pid in found and found[proc.pid] is None):
                    found[proc.pid] = None
                else:
                    found[proc.pid] = (found.get(proc.pid) or 0) + int(used)
        return found

    def devices(self) -> list[DeviceUsage]:
        """Memory of every device."""
        nvml = self._nvml()
        usage = []
        for index, handle in enumerate(self._handles()):
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            usage.append(
                DeviceUsage(
                    index=index,
                    used_bytes=int(memory.used),
                    total_bytes=int(memory.total),
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                )
            )
        return usage

    def used_bytes(self) -> int:
        """Device memory used on all devices together."""
        return sum(device.used_bytes for device in self.devices())

    # Async faces, for backends.

    async def aprocess_bytes(self, pids: Iterable[int]) -> dict[int, int | None]:
        return await asyncio.to_thread(self.process_bytes, tuple(pids))

    async def adevices(self) -> list[DeviceUsage]:
        return await asyncio.to_thread(self.devices)

    async def aused_bytes(self) -> int:
        return await asyncio.to_thread(self.used_bytes)


def known_total(per_pid: Mapping[int, int | None]) -> int | None:
    """The sum of the figures, or None when any figure is missing or nothing was listed."""
    if not per_pid or any(value is None for value in per_pid.values()):
        return None
    return sum(value or 0 for value in per_pid.values())
