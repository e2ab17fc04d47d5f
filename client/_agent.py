"""Register this process with the node's snapshot agent, when one is configured.

`rlslice run` and the Kubernetes pod mutation set `RLSLICE_AGENT_SOCKET`; a launcher that
registered the process already sets `RLSLICE_AGENT_REGISTERED` as well. The agent reads the
caller's pid from the socket's peer credentials, so it must be this process that calls.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import os

from rlslice.client._settings import ENV_AGENT_REGISTERED

log = logging.getLogger("rlslice.client")

_LOCAL_MODULE = "rlslice.client._local"


async def register_with_local_agent(socket_path: str, job: str, group: str) -> bool:
    """Register this process with the agent at `socket_path`; True when it registered.

    Marks the environment so that this process (and the children it starts, which the
    agent tracks with it) does not register again. Errors from the agent propagate: a job
    the agent cannot see would not have its device state moved at a switch.
    """
    if os.environ.get(ENV_AGENT_REGISTERED):
        return False
    try:
        local = importlib.import_module(_LOCAL_MODULE)
    except ModuleNotFoundError as error:
        if error.name != _LOCAL_MODULE:
            raise
        log.warning(
            "RLSLICE_AGENT_SOCKET is set but this rlslice has no local agent support; "
            "the process is not registered with the agent"
        )
        return False
    register = local.register_with_agent
    if inspect.iscoroutinefunction(register):
        await register(socket_path, job, group)
    else:  # a blocking Unix-socket call: keep the event loop free
        await asyncio.to_thread(register, socket_path, job, group)
    os.environ[ENV_AGENT_REGISTERED] = "1"
    log.info("registered pid %d of job %r with the agent at %s", os.getpid(), job, socket_path)
    return True
