"""A parked job's communicators: suspended and resumed where NCCL can, else rebuilt.

Before a job is parked its process groups are quiesced: `RankedClient` holds every rank at
a barrier at the end of each phase, so no collective is in flight when the agent moves the
job. What happens to the communicators themselves depends on the node:

| path | when | at a snapshot | at a restore |
|---|---|---|---|
| `suspend` | the loaded libnccl is 2.29.7 or newer and exports `ncclCommSuspend`/`ncclCommResume` | each communicator is suspended (its device buffers freed) | resumed |
| `rebuild` | NCCL without them | the job's NCCL process groups are destroyed | rebuilt (the job's own `rebuild` callback) |
| `none` | no NCCL in the process (gloo on CPU) | nothing: gloo holds no device memory | nothing |

`communicator_path(library)` decides from a library object (the loaded libnccl through
ctypes, or a stand-in in tests) and says why; `rlslice probe` prints it for the node.
`CommunicatorOffloader` is the `Offloader` an `app` job adds to its offload loop so the
agent's OFFLOAD and RESTORE commands carry the communicators with the tensors.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlslice._errors import FailedPreconditionError
from rlslice.client.offload._types import OFFLOAD, OffloadResult

#: `ncclGetVersion`'s code of the first NCCL with ncclCommSuspend/ncclCommResume (2.29.7).
SUSPEND_VERSION = 22907
SYMBOLS = ("ncclCommSuspend", "ncclCommResume")


def version_text(code: int) -> str:
    """NCCL's version code as `major.minor.patch` (codes from 2.9 on: major*10000+minor*100+patch)."""
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def nccl_version(library: Any) -> int | None:
    """`ncclGetVersion` of `library`, or None when it has none or it fails."""
    try:
        get = library.ncclGetVersion
    except AttributeError:
        return None
    code = ctypes.c_int(0)
    if get(ctypes.byref(code)) != 0:
        return None
    return int(code.value)


@dataclass(frozen=True)
class CommunicatorPath:
    """What a node's NCCL does with a parked job's communicators, and why."""

    kind: str
    """"suspend", "rebuild" or "none"."""
    detail: str


def _exports(library: Any, symbol: str) -> bool:
    try:
        getattr(library, symbol)
    except AttributeError:  # ctypes raises it for a symbol the library does not export
        return False
    return True


def communicator_path(library: Any | None) -> CommunicatorPath:
    """The path a process with `library` (libnccl, or None: no NCCL) gets."""
    if library is None:
        return CommunicatorPath("none", "no libnccl in this process: gloo holds no device memory")
    version = nccl_version(library)
    shown = version_text(version) if version is not None else "unknown version"
    missing = [symbol for symbol in SYMBOLS if not _exports(library, symbol)]
    if version is not None and version >= SUSPEND_VERSION and not missing:
        return CommunicatorPath("suspend", f"NCCL {shown}: ncclCommSuspend/ncclCommResume")
    why = (
        f"lacks {', '.join(missing)}" if missing else f"older than {version_text(SUSPEND_VERSION)}"
    )
    return CommunicatorPath("rebuild", f"NCCL {shown} {why}: groups destroyed and rebuilt")


def _loaded_nccl() -> str | None:
    """The path of a libnccl this process mapped already (torch loads its own)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        path = line.split()[-1] if line.split() else ""
        if "libnccl" in Path(path).name:
            return path
    return None


def _wheel_nccl() -> str | None:
    """libnccl of the `nvidia-nccl` wheel torch installs with it, if present."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        return None
    for folder in spec.submodule_search_locations or () if spec is not None else ():
        found = sorted(Path(folder, "lib").glob("libnccl.so*"))
        if found:
            return str(found[0])
    return None


def load_nccl() -> Any | None:
    """libnccl through ctypes: the one this process loaded, else torch's wheel's, else the
    system's; None if none."""
    path = _loaded_nccl() or _wheel_nccl() or ctypes.util.find_library("nccl")
    if path is None:
        return None
    try:
        return ctypes.CDLL(path)
    except OSError:
        return None


class CommunicatorOffloader:
    """Suspend (or destroy) a job's communicators on OFFLOAD, resume (or rebuild) them on
    RESTORE; an `Offloader` for the offload loop, listed after the tensors' offloader.

    `communicators`: the raw `ncclComm_t` handles (the suspend path). `destroy` and
    `rebuild`: the job's own callables for the rebuild path (say, destroying its NCCL
    process groups and creating them again); both run on every rank at the same command,
    which the agent sends to all of them at once. `library` defaults to `load_nccl()`.
    """

    modes = frozenset({OFFLOAD})
    tags = ("communicators",)

    def __init__(
        self,
        communicators: Sequence[int] = (),
        *,
        destroy: Callable[[], object] | None = None,
        rebuild: Callable[[], object] | None = None,
        library: Any | None = None,
    ) -> None:
        self._library = library if library is not None else load_nccl()
        self.path = communicator_path(self._library)
        self._comms = tuple(communicators)
        self._destroy, self._rebuild = destroy, rebuild
        if self.path.kind == "rebuild" and (destroy is None) != (rebuild is None):
            raise FailedPreconditionError(
                "communicators: the rebuild path needs both destroy and rebuild"
            )
        self._parked = False
        self._lock = threading.Lock()

    def _call(self, symbol: str, *args: object) -> None:
        for comm in self._comms:
            result = getattr(self._library, symbol)(ctypes.c_void_p(comm), *args)
            if result != 0:
                raise FailedPreconditionError(f"communicators: {symbol} answered {result}")

    def offload(self, discard_tags: Sequence[str] = ()) -> OffloadResult:
        del discard_tags
        with self._lock:
            if self._parked:
                return OffloadResult(bytes=0, seconds=0.0)
            if self.path.kind == "suspend":
                self._call("ncclCommSuspend", ctypes.c_int(0))
            elif self.path.kind == "rebuild" and self._destroy is not None:
                self._destroy()
            self._parked = True
            return OffloadResult(bytes=0, seconds=0.0)

    def restore(self) -> OffloadResult:
        with self._lock:
            if not self._parked:
                return OffloadResult(bytes=0, seconds=0.0)
            if self.path.kind == "suspend":
                self._call("ncclCommResume")
            elif self.path.kind == "rebuild" and self._rebuild is not None:
                self._rebuild()
            self._parked = False
            return OffloadResult(bytes=0, seconds=0.0)
