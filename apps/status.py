"""`rlslice status [GROUP]`: groups as a table (holder, queue, resident, parked, lock-only
jobs, epoch, last switch, switches, busy), or `--json`.

"lock only" lists the jobs no agent of the group knew when they registered: they take turns
on the lock, but their switches move nothing of them (`rlslice.scheduler.core.registration`).
"parked" names, after a partly parked job, which of its tagged parts are in host memory
and which were discarded (`job-a (parked p3; discarded p0)`; the rest stayed on the
device), from the job's `parked_parts` and `discarded_parts`; a job parked whole stands
alone."""

from __future__ import annotations

import argparse
from typing import Any

from rlslice.apps.shared.flags import add_connection_flags, connection_from
from rlslice.apps.shared.parts import job_with_parts


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("group", nargs="?", default="", help="one group (default: all)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_connection_flags(parser)
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
        print(json.dumps([as_json(g) for g in groups], indent=2))
        return 0
    _table(groups)
    return 0


def as_json(message: Any) -> dict[str, Any]:
    """A message as JSON values, 64-bit integers as numbers (protobuf's JSON mapping writes
    them as strings, `"switches": "20"`, which no reader of a status expects)."""
    from google.protobuf.json_format import MessageToDict

    return _numbers(MessageToDict(message, preserving_proto_field_name=True), message.DESCRIPTOR)


def _numbers(value: dict[str, Any], descriptor: Any) -> dict[str, Any]:
    from google.protobuf.descriptor import FieldDescriptor as F

    wide = (F.CPPTYPE_INT64, F.CPPTYPE_UINT64)
    for field in descriptor.fields:
        if field.name not in value:
            continue
        entry = field.message_type
        if entry is not None and entry.GetOptions().map_entry:
            item = entry.fields_by_name["value"]
            if item.message_type is not None:
                value[field.name] = {
                    k: _numbers(v, item.message_type) for k, v in value[field.name].items()
                }
            elif item.cpp_type in wide:
                value[field.name] = {k: int(v) for k, v in value[field.name].items()}
        elif entry is not None:
            # protobuf 7 (what `pip install rlslice` resolves) has no `label`.
            if field.is_repeated:
                value[field.name] = [_numbers(v, entry) for v in value[field.name]]
            else:
                value[field.name] = _numbers(value[field.name], entry)
        elif field.cpp_type in wide:
            raw = value[field.name]
            value[field.name] = [int(v) for v in raw] if isinstance(raw, list) else int(raw)
    return value


async def _fetch(args: argparse.Namespace) -> list[Any]:
    from rlslice.adapters.channel import open_channel
    from rlslice.v1alpha1 import scheduler_pb2 as pb
    from rlslice.v1alpha1 import scheduler_pb2_grpc

    connection = connection_from(args)
    async with open_channel(
        connection.address, tls=connection.tls, token=connection.token
    ) as channel:
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
    "lock only",
    "epoch",
    "last switch",
    "switches",
    "busy",
)


def _rows(groups: list[Any]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for g in groups:
        last = f"{g.last_switch_seconds * 1000:.1f} ms" if g.switches else "-"
        rows.append(
            (
                g.spec.name,
                g.phase,
                g.holder or "-",
                ", ".join(g.queue) or "-",
                ", ".join(g.resident) or "-",
                ", ".join(_parked(g, j) for j in g.parked) or "-",
                ", ".join(j.job for j in g.jobs if j.lock_only) or "-",
                str(g.epoch),
                last,
                str(g.switches),
                f"{g.busy_fraction:.0%}",
            )
        )
    return rows


def _parked(group: Any, job: str) -> str:
    """`job`, with its parked and discarded parts when only some of its parts moved."""
    shown = next((j for j in group.jobs if j.job == job), None)
    if shown is None:
        return job
    return job_with_parts(job, shown.parked_parts, shown.discarded_parts)


def _table(groups: list[Any], console: Any = None) -> None:
    """A rich table on a terminal where rich is installed (the console extra), else aligned
    plain text: the base install a training job has must show status too, and a pipe gets
    every name whole. A table too wide for the terminal becomes one block per group: no
    name or value is cut."""
    import sys

    try:
        from rich.console import Console
        from rich.table import Table
    except ModuleNotFoundError:
        plain = True
    else:
        plain = console is None and not sys.stdout.isatty()
    if plain:
        lines = [_COLUMNS, *_rows(groups)]
        widths = [max(len(line[i]) for line in lines) for i in range(len(_COLUMNS))]
        for line in lines:
            print(
                "  ".join(
                    cell.ljust(width) for cell, width in zip(line, widths, strict=True)
                ).rstrip()
            )
        return
    console = console or Console()
    rows = _rows(groups)
    table = Table(title="rlslice groups")
    for column in _COLUMNS:
        table.add_column(column, no_wrap=True)
    for row in rows:
        table.add_row(*row)
    if _natural_width(table) <= console.width:
        console.print(table)
        return
    # Too wide for the terminal (rich would cut names with "…"): one block per group.
    for row in rows:
        block = Table(show_header=False)
        block.add_column("field", no_wrap=True)
        block.add_column("value", overflow="fold")
        for column, cell in zip(_COLUMNS[1:], row[1:], strict=True):
            block.add_row(column, cell)
        console.print(f"group {row[0]}", markup=False, highlight=False, soft_wrap=True)
        console.print(block)


def _natural_width(table: Any) -> int:
    """Columns `table` takes when nothing limits it."""
    import io

    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=100_000, color_system=None).print(table)
    return max((len(line.rstrip()) for line in out.getvalue().splitlines()), default=0)
