"""The `cuda-checkpoint` backend: NVIDIA's binary, one process per exec.

`cuda-checkpoint --action lock --pid P --timeout MS`, then `--action checkpoint`; restore is
`--action restore` then `--action unlock`; `--get-state` reads where a process is. The
sequence and its rollback are the `cuda` backend's (`_checkpoint.py`); every exec has a
deadline and is killed when it passes. Each exec costs seconds where the driver API costs
milliseconds: use this backend where cuda-python cannot be installed.

The binary is found on PATH, or named by the agent-level option `binary` (never by a group
spec: the agent would exec whatever a group names). Options as for `cuda`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import time
from collections.abc import Sequence
from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from rlslice.snapshot_agent.backends import _options
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

BINARY = "cuda-checkpoint"
MIN_DRIVER_MAJOR = 570  # the separate lock action with a timeout
_STATE_WORDS = {state.value: state for state in ProcState}


class Cli:
    """Per-process operations by exec'ing the binary."""

    def __init__(self, binary: str) -> None:
        self.binary = binary

    async def run(self, op: str, pid: int, args: Sequence[str], deadline: float) -> str:
        """Exec the binary; stdout on success; StepError on failure; killed at the deadline."""
        remaining = deadline - time.time()
        if remaining <= 0:
            raise TimeoutError(f"deadline passed before {op} of pid {pid}")
        proc = await asyncio.create_subprocess_exec(
            self.binary,
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), remaining)
        except TimeoutError as error:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            await proc.wait()
            raise TimeoutError(
                f"{op} of pid {pid}: {self.binary} killed at the deadline"
            ) from error
        finally:
            if proc.returncode is None:  # cancelled: leave no child behind
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
        if proc.returncode != 0:
            text = (err or out).decode(errors="replace").strip().splitlines()
            reason = text[-1] if text else f"exit status {proc.returncode}"
            raise StepError(op, pid, reason)
        return out.decode(errors="replace")

    async def get_state(self, pid: int, *, deadline: float) -> ProcState:
        try:
            out = await self.run("get-state", pid, ["--get-state", "--pid", str(pid)], deadline)
        except StepError as error:
            # The binary cannot tell a process without CUDA from other refusals; the mover
            # cross-checks with NVML before it skips a process that holds device memory.
            raise NotCudaProcess("get-state", pid, error.reason) from error
        words = re.findall(r"[a-z]+", out.lower())
        for word in reversed(words):
            if word in _STATE_WORDS:
                return _STATE_WORDS[word]
        raise StepError("get-state", pid, f"unreadable answer {out.strip()!r}")

    async def lock(self, pid: int, *, timeout_ms: int, deadline: float) -> None:
        args = ["--action", "lock", "--pid", str(pid), "--timeout", str(timeout_ms)]
        await self.run("lock", pid, args, deadline)

    async def checkpoint(self, pid: int, *, deadline: float) -> None:
        await self.run("checkpoint", pid, ["--action", "checkpoint", "--pid", str(pid)], deadline)

    async def restore(self, pid: int, *, deadline: float) -> None:
        await self.run("restore", pid, ["--action", "restore", "--pid", str(pid)], deadline)

    async def unlock(self, pid: int, *, deadline: float) -> None:
        await self.run("unlock", pid, ["--action", "unlock", "--pid", str(pid)], deadline)


class CudaCheckpointOptions(BaseModel):
    """The agent-level option only this backend reads (the moves' are `CheckpointOptions`)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    binary: str = ""
    """The `cuda-checkpoint` executable (empty: found on PATH); never from a group spec."""


class CudaCheckpointBackend(MoverBackend):
    """Moves jobs by exec'ing NVIDIA's `cuda-checkpoint` (see the module docstring)."""

    name: ClassVar[str] = "cuda-checkpoint"

    def __init__(self, context: BackendContext, *, nvml: Nvml | None = None) -> None:
        self._context = context
        self._options = dict(context.options)
        self.options = _options.parse(CudaCheckpointOptions, self._options, error=BackendError)
        self._nvml = nvml if nvml is not None else Nvml()
        self._mover: CheckpointMover | None = None

    def _binary(self) -> str | None:
        configured = self.options.binary
        if configured:
            return configured if os.access(configured, os.X_OK) else None
        return shutil.which(BINARY)

    def _get_mover(self) -> CheckpointMover:
        if self._mover is None:
            binary = self._binary()
            if binary is None:
                raise BackendError(f"{self.name}: no executable {BINARY} on PATH")
            self._mover = CheckpointMover(
                Cli(binary),
                self._nvml,
                state_dir=self._context.state_dir,
                backend=self.name,
                options=self._options,
            )
        return self._mover

    async def probe(self) -> ProbeResult:
        binary = self._binary()
        if binary is None:
            where = self.options.binary or f"{BINARY} on PATH"
            return ProbeResult(False, f"no executable {where}")
        try:
            help_text = await Cli(binary).run("help", 0, ["--help"], time.time() + 10.0)
        except (StepError, TimeoutError, OSError) as error:
            return ProbeResult(False, f"{binary} --help failed: {error}")
        if "--action" not in help_text or "lock" not in help_text:
            return ProbeResult(False, f"{binary} has no lock action: it needs the r570+ version")
        version = re.search(r"Version\s+([0-9.]+)", help_text)
        try:
            release = await asyncio.to_thread(self._nvml.driver_version)
        except NvmlUnavailable as error:
            return ProbeResult(False, f"NVML is needed to measure bytes: {error}")
        if int(release.split(".")[0]) < MIN_DRIVER_MAJOR:
            return ProbeResult(False, f"driver {release} is older than r{MIN_DRIVER_MAJOR}")
        tool = version.group(1) if version else "unknown version"
        return ProbeResult(True, f"{binary} ({tool}), driver {release}")
