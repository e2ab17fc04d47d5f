"""`rlslice agent remove NODE [--force]`: take a node's agent out of the scheduler (admin).

Groups without an explicit node list then switch through the remaining agents. Refused
FAILED_PRECONDITION, naming the job, while a job's state is on the node, unless `--force`
(which gives that state up). The admin token comes from `--token-file` or the environment.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from typing import Any

from rlslice.apps.shared.flags import add_connection_flags, connection_from


def parser() -> argparse.ArgumentParser:
    """The parser of the words after `rlslice agent remove`."""
    p = argparse.ArgumentParser(prog="rlslice agent remove", allow_abbrev=False)
    p.add_argument("node", help="node whose agent to remove")
    p.add_argument("--force", action="store_true", help="remove even with a job's state there")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait (default 10)")
    add_connection_flags(p)
    return p


def run(argv: Sequence[str]) -> int:
    """Remove the agent `argv` names; 0 when removed, 1 when refused or unknown."""
    args = parser().parse_args(list(argv))
    import grpc

    try:
        removed = asyncio.run(_remove(args))
    except grpc.aio.AioRpcError as error:
        print(f"rlslice agent remove: {error.code().name}: {error.details()}", file=sys.stderr)
        return 1
    if not removed:
        print(f"rlslice agent remove: no agent registered for node {args.node}", file=sys.stderr)
        return 1
    print(f"removed the agent of node {args.node}")
    return 0


async def _remove(args: argparse.Namespace) -> bool:
    from rlslice.adapters.channel import open_channel
    from rlslice.v1alpha1 import scheduler_pb2 as pb
    from rlslice.v1alpha1 import scheduler_pb2_grpc

    connection = connection_from(args)
    async with open_channel(
        connection.address, tls=connection.tls, token=connection.token
    ) as channel:
        stub: Any = scheduler_pb2_grpc.SchedulerStub(channel)
        request = pb.RemoveAgentRequest(node=args.node, force=args.force)
        answer = await stub.RemoveAgent(request, timeout=args.timeout)
        return bool(answer.removed)
