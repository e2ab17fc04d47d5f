"""`rlslice timeline GROUP --out FILE`: where a group's GPU time went, as a picture and a trace.

Reads the group's bounded event ring from the scheduler (`GetEvents`) or from a saved log
(`--from-log`, the JSON form of a `GetEventsResponse`, as `--save-log` writes it), folds it
into lanes (`rlslice.apps.timeline.trace_export.build_timeline`) and writes, by the suffix of each
`--out`:

- `.json`: a Chrome trace (open it in Perfetto, ui.perfetto.dev, or chrome://tracing);
- `.png`: a picture drawn by the planner's `plot_timeline` (the same style as `rlslice
  simulate`): one lane per job with its GPU phases (`gpu:<phase>`) and waits, the
  snapshot/restore lanes, the spill lane (the agents' disk tier: spill and fill per job), and
  the switches lane. Instants (yields, faults) are in the trace only.

grpc and matplotlib are imported only when needed, so the pure parts stay light.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, cast

from rlslice.apps.shared.flags import add_connection_flags, connection_from
from rlslice.apps.timeline.trace_export import (
    Event,
    JobParts,
    Timeline,
    build_timeline,
    chrome_trace,
    event_to_dict,
    events_from_json,
    plot_lanes,
)

if TYPE_CHECKING:
    from rlslice.config import TLSConfig
    from rlslice.v1alpha1 import scheduler_pb2

SUFFIXES = (".json", ".png")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("group", help="group id")
    parser.add_argument(
        "--out",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help="output file; .json writes a Chrome trace, .png a picture (repeat for both)",
    )
    add_connection_flags(parser)
    parser.add_argument(
        "--from-log",
        type=Path,
        metavar="EVENTS.json",
        help="read events from this file instead of asking the scheduler",
    )
    parser.add_argument(
        "--save-log", type=Path, metavar="EVENTS.json", help="also save the raw events here"
    )
    parser.add_argument(
        "--limit", type=int, default=0, help="at most this many newest events (0: all kept)"
    )
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds for the RPC")


def run(args: argparse.Namespace) -> int:
    outs: list[Path] = list(args.out)
    if not outs:
        print("timeline: --out: give at least one FILE.json or FILE.png", file=sys.stderr)
        return 2
    for out in outs:
        if out.suffix.lower() not in SUFFIXES:
            print(f"timeline: --out: {out}: suffix must be .json or .png", file=sys.stderr)
            return 2
    if args.limit < 0:
        print("timeline: --limit: must be 0 or more", file=sys.stderr)
        return 2
    if args.from_log is not None:
        try:
            events = events_from_json(json.loads(args.from_log.read_text()))
        except (OSError, ValueError) as error:
            print(f"timeline: --from-log: {args.from_log}: {error}", file=sys.stderr)
            return 2
    else:
        import asyncio

        from rlslice._errors import RlsliceError

        try:
            connection = connection_from(args)
        except RlsliceError as error:
            print(f"timeline: {error}", file=sys.stderr)
            return 2
        try:
            events = asyncio.run(
                fetch_events(
                    connection.address,
                    args.group,
                    args.limit,
                    connection.token or "",
                    args.timeout,
                    tls=connection.tls,
                )
            )
        except RlsliceError as error:
            print(f"timeline: {connection.address}: {error}", file=sys.stderr)
            return 1
    if args.save_log is not None:
        args.save_log.write_text(
            json.dumps({"events": [event_to_dict(e) for e in events]}, indent=1)
        )
    timeline = build_timeline(events, args.group)
    if not timeline.lanes:
        print(f"timeline: group {args.group!r}: no events", file=sys.stderr)
    for out in outs:
        write(timeline, out)
        print(f"wrote {out}")
    return 0


def write(timeline: Timeline, out: Path) -> None:
    """Write `timeline` to `out`: a Chrome trace for .json, a picture for .png."""
    if out.suffix.lower() == ".png":
        plot_timeline(timeline, out)
    else:
        out.write_text(json.dumps(chrome_trace(timeline)))


async def fetch_events(
    address: str,
    group: str,
    limit: int = 0,
    token: str = "",
    timeout: float = 10.0,
    *,
    tls: TLSConfig | None = None,
) -> list[Event]:
    """The group's event ring from the scheduler at `address` (raises an rlslice error)."""
    import grpc

    from rlslice.adapters.channel import open_channel
    from rlslice.adapters.grpc_errors import error_from_rpc
    from rlslice.v1alpha1 import scheduler_pb2, scheduler_pb2_grpc

    async with open_channel(address, tls=tls, token=token or None) as channel:
        # The async stub type exists only in the .pyi (mypy-protobuf); at run time it is the same.
        stub = cast(
            "scheduler_pb2_grpc.SchedulerAsyncStub", scheduler_pb2_grpc.SchedulerStub(channel)
        )
        try:
            answer = await stub.GetEvents(
                scheduler_pb2.GetEventsRequest(group=group, limit=limit), timeout=timeout
            )
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None
    return [event_from_proto(e) for e in answer.events]


def event_from_proto(message: scheduler_pb2.GroupEvent) -> Event:
    """The plain `Event` of a `GroupEvent`; of its `status` only the partly parked jobs'
    parts are kept (`Event.parts`)."""
    from rlslice.v1alpha1 import scheduler_pb2

    parts = tuple(
        JobParts(j.job, tuple(j.parked_parts), tuple(j.discarded_parts))
        for j in message.status.jobs
        if j.parked_parts or j.discarded_parts
    )
    return Event(
        time=message.time,
        group=message.group,
        kind=scheduler_pb2.EventKind.Name(message.kind).removeprefix("EVENT_KIND_"),
        job=message.job,
        epoch=message.epoch,
        seconds=message.seconds,
        bytes=message.bytes,
        detail=message.detail,
        seq=message.seq,
        parts=parts,
    )


def plot_timeline(timeline: Timeline, out: Path) -> Path:
    """Draw `timeline` to a PNG at `out` with the planner's plotter (one drawing style for
    simulated and measured timelines): a lane per job, the moves lanes, then the switches."""
    from rlslice.planner.timeline import plot_timeline as draw

    lanes, switches = plot_lanes(timeline)
    return draw(lanes, out, switches=switches, title=f"group {timeline.group}: GPU time by job")


__all__ = ["event_from_proto", "fetch_events", "plot_timeline", "write"]
