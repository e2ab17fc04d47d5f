"""The job side of rlslice: hold a group of GPUs for the GPU phases of a training loop.

>>> from rlslice.client import Client                       # doctest: +SKIP
>>> client = Client(job="grpo-7b", group="gpus-a")           # doctest: +SKIP
>>> with client.phase("train"):                              # doctest: +SKIP
...     train_step()

`AsyncClient` is the implementation, for asyncio code; `Client` runs it on a private loop
thread for blocking code. Without a scheduler configured both pass every call through.
`RankedClient` is a `Client` for a job of many ranks (torch.distributed): rank 0 asks for
the job, every rank enters and leaves each phase together.
`rlslice.testing` runs a real scheduler in-process for your own tests.
"""

from rlslice.client._async_client import AsyncClient
from rlslice.client._communicators import CommunicatorOffloader, communicator_path
from rlslice.client._local import register_with_agent, register_with_agent_async
from rlslice.client._phase import validate_phase
from rlslice.client._ranks import RankedClient, Ranks, detect_ranks
from rlslice.client._results import Grant, YieldResult
from rlslice.client._sync_client import Client

__all__ = [
    "AsyncClient",
    "Client",
    "CommunicatorOffloader",
    "Grant",
    "RankedClient",
    "Ranks",
    "YieldResult",
    "communicator_path",
    "detect_ranks",
    "register_with_agent",
    "register_with_agent_async",
    "validate_phase",
]
