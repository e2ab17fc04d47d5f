"""Application-aware offload: a job's own processes give their GPU memory back on the agent's
command (the `app` backend), with no privileges and no driver checkpoint API.

```
from rlslice.client.offload import TorchOffloader, start_offload_thread

offloader = TorchOffloader()
offloader.register(model, "weights")
offloader.register(optimizer, "optimizer")
service = start_offload_thread(offloader, job="trainer-a", group="gpus")
```

`serve_offload` is the same loop as a coroutine. `VllmOffloader(port)` and
`SglangOffloader(port)` put the job's own local inference server to sleep and wake it.
`MemorySaverOffloader()` parks what a preloaded torch-memory-saver allocated in its regions,
with no `register` calls.
See docs/backends.md.
"""

from typing import TYPE_CHECKING

from rlslice.client.offload._http import SglangOffloader, VllmOffloader
from rlslice.client.offload._memory_saver import MemorySaverOffloader
from rlslice.client.offload._serve import (
    AGENT_SOCKET_ENV,
    OffloadThread,
    serve_offload,
    start_offload_thread,
)
from rlslice.client.offload._types import DISCARD, OFFLOAD, Offloader, OffloadResult

if TYPE_CHECKING:
    from rlslice.client.offload._torch import TorchOffloader

__all__ = [
    "AGENT_SOCKET_ENV",
    "DISCARD",
    "OFFLOAD",
    "MemorySaverOffloader",
    "OffloadResult",
    "OffloadThread",
    "Offloader",
    "SglangOffloader",
    "TorchOffloader",
    "VllmOffloader",
    "serve_offload",
    "start_offload_thread",
]


def __getattr__(name: str) -> object:
    # torch is heavy and optional: import it only when the torch offloader is asked for.
    if name == "TorchOffloader":
        from rlslice.client.offload._torch import TorchOffloader

        return TorchOffloader
    raise AttributeError(f"module 'rlslice.client.offload' has no attribute {name!r}")
