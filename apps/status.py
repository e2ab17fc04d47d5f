"""`rlslice status [GROUP]`: groups as a table (holder, queue, resident, parked, epoch, last
switch), or `--json`."""

from __future__ import annotations

import argparse
import os
from typing import Any


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("group", nargs="?", default="", help="one group (default: all)")
    parser.add_argument(
        "--scheduler",
        default=os.environ.get("RLSLICE_SCHEDULER", "127.0.0.1:50551"),
        help="scheduler address (RLSLICE_SCHEDULER; default %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--tls-ca",
        default=os.environ.get("RLSLICE_TLS_CA"),
        help="CA of the scheduler (RLSLICE_TLS_CA)",
    )
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for an answer")


def run(args: argparse.Namespace) -> int:
    import asyncio
    import json
    import sys

    import grpc

    try:
        groups = asyncio.run(_fetch(args))
    except grpc.aio.AioRpcError as error:
        print(f"rlslice status: {error.code().name}: {error.details()}", file=sys.stderr)
        return 1
    if args.json:
        from google.protobuf.json_format import MessageToDict

        print(
            json.dumps(
                [MessageToDict(g, preserving_proto_field_name=True) for g in groups], indent=2
            )
        )
        return 0
    _table(groups)
    return 0


async def _fetch(args: argparse.Namespace) -> list[Any]:
    from pathlib import Path

    from rlslice.adapters.channel import open_channel
    from rlslice.config import TLSConfig
    from rlslice.v1alpha1 import scheduler_pb2 as pb
    from rlslice.v1alpha1 import scheduler_pb2_grpc

    tls = TLSConfig(ca=Path(args.tls_ca)) if args.tls_ca else None
    token = os.environ.get("RLSLICE_TOKEN") or None
    async with open_channel(args.scheduler, tls=tls, token=token) as channel:
        stub: Any = scheduler_pb2_grpc.SchedulerStub(channel)
        if args.group:
            return [await stub.GetGroup(pb.GetGroupRequest(group=args.group), timeout=args.timeout)]
        answer = await stub.ListGroups(pb.ListGroupsRequest(), timeout=args.timeout)
        return list(answer.groups)


_COLUMNS = (
    "group",
    "phase",
    "holder",
    "queue",
    "resident",
    "parked",
    "epoch",
    "last switch",
    "switches",
    "busy",
)


def _rows(groups: list[Any]) -> list[tuple[str, ...]]:
    rows = []
    for g in groups:
        last = f"{g.last_switch_seconds * 1000:.1f} ms" if g.switches else "-"
        rows.append(
            (
                g.spec.name,
                g.phase,
                g.holder or "-",
                ", ".join(g.queue) or "-",
                ", ".join(g.resident) or "-",
                ", ".join(g.parked) or "-",
                str(g.epoch),
                last,
                str(g.switches),
                f"{g.busy_fraction:.0%}",
            )
        )
    return rows


def _table(groups: list[Any]) -> None:
    """A rich table where rich is installed (the console extra), else aligned plain text:
    the base install a training job has must show status too."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ModuleNotFoundError:
        lines = [_COLUMNS, *_rows(groups)]
        widths = [max(len(line[i]) for line in lines) for i in range(len(_COLUMNS))]
        for line in lines:
            print(
                "  ".join(
                    cell.ljust(width) for cell, width in zip(line, widths, strict=True)
                ).rstrip()
            )
        return
    table = Table(title="rlslice groups")
    for column in _COLUMNS:
        table.add_column(column)
    for row in _rows(groups):
        table.add_row(*row)
    Console().print(table)
