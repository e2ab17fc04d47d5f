"""`rlslice profile`: a job's phase profile (YAML, with percentiles) from what a scheduler saw.

Sources, one of:

- `--from-log EVENTS.json`: a recorded timeline (`rlslice timeline G --save-log`, the JSON
  form of a `GetEventsResponse`; the scheduler keeps a bounded ring per group);
- `--watch GROUP --seconds S`: the scheduler's `Watch` stream of GROUP for S seconds
  (everything, however long the run; `--save-log` keeps the events for later).

The profile arithmetic is `rlslice.planner.profile_events.profiles_from_events`; this module only
reads, writes and prints. The YAML is what `rlslice advise` takes (a hand-written profile
loads the same way).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO, cast

from rlslice.apps.shared.flags import add_connection_flags, connection_from, size
from rlslice.apps.timeline.trace_export import Event, event_to_dict, events_from_json

if TYPE_CHECKING:
    from rlslice.config import TLSConfig
    from rlslice.planner.profile import WorkloadProfile


def configure(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--from-log", type=Path, metavar="EVENTS.json", help="a recorded timeline's events"
    )
    source.add_argument("--watch", metavar="GROUP", help="follow the scheduler's Watch of GROUP")
    parser.add_argument(
        "--seconds", type=float, default=60.0, help="with --watch: how long to record"
    )
    parser.add_argument("--group", default="", help="with --from-log: only this group's events")
    parser.add_argument(
        "--job", action="append", default=[], help="profile only this job (repeat); default all"
    )
    parser.add_argument(
        "--state-bytes",
        type=size,
        help="device state per GPU (256Mi, 16Gi); default: estimated from the switches",
    )
    parser.add_argument("--max-slowdown", type=float, help="the slowdown the job(s) accept")
    parser.add_argument("--out", type=Path, help="write the profiles here (default: stdout)")
    parser.add_argument(
        "--save-log", type=Path, metavar="EVENTS.json", help="with --watch: also save the events"
    )
    add_connection_flags(parser)


class _Refused(Exception):
    """The command stops with `code` and prints the message after `profile: `."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def run(args: argparse.Namespace) -> int:
    import yaml
    from pydantic import ValidationError

    from rlslice.planner.profile import dump_profiles
    from rlslice.planner.profile_events import profiles_from_events

    try:
        events, group, source = _from_log(args) if args.from_log is not None else _watched(args)
    except _Refused as refused:
        print(f"profile: {refused}", file=sys.stderr)
        return refused.code
    try:
        profiles = profiles_from_events(
            events,
            jobs=args.job,
            source=source,
            state_bytes=args.state_bytes,
            max_slowdown=args.max_slowdown,
        )
    except (ValidationError, ValueError) as error:
        print(f"profile: {error}", file=sys.stderr)
        return 2
    if not profiles:
        print(f"profile: no job held group {group or '(any)'} in the events", file=sys.stderr)
        return 1
    text = yaml.safe_dump(dump_profiles(profiles), sort_keys=False)
    if args.out is not None:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    print_summary(profiles, file=sys.stderr if args.out is None else sys.stdout)
    return 0


def _from_log(args: argparse.Namespace) -> tuple[list[Event], str, str]:
    """`--from-log`: the events of the log (of `--group` only, if given), group, source."""
    try:
        events = events_from_json(json.loads(args.from_log.read_text()))
    except (OSError, ValueError) as error:
        raise _Refused(2, f"--from-log: {args.from_log}: {error}") from None
    group = args.group
    return [e for e in events if not group or e.group == group], group, f"log {args.from_log.name}"


def _watched(args: argparse.Namespace) -> tuple[list[Event], str, str]:
    """`--watch`: the group's events for `--seconds` (saved with `--save-log`), group, source."""
    import asyncio

    from rlslice._errors import RlsliceError

    if args.seconds <= 0:
        raise _Refused(2, "--seconds: must be positive")
    try:
        connection = connection_from(args)
    except RlsliceError as error:
        raise _Refused(2, str(error)) from None
    try:
        events = asyncio.run(
            watch_events(
                connection.address,
                args.watch,
                args.seconds,
                connection.token or "",
                tls=connection.tls,
            )
        )
    except RlsliceError as error:
        raise _Refused(1, f"{connection.address}: {error}") from None
    if args.save_log is not None:
        args.save_log.write_text(
            json.dumps({"events": [event_to_dict(e) for e in events]}, indent=1)
        )
    return events, args.watch, f"watch {args.watch}"


def print_summary(profiles: tuple[WorkloadProfile, ...], *, file: TextIO) -> None:
    """One line per phase: median, p90, p99 seconds and how often it was seen."""
    for profile in profiles:
        print(
            f"{profile.name}: cycle {profile.cycle_seconds:.3f} s, GPU {profile.gpu_fraction:.0%}, "
            f"state {profile.state_bytes} B, {profile.cycles or 0} cycles",
            file=file,
        )
        for phase in profile.phases:
            stats = phase.stats
            tail = (
                f"p50 {stats.p50:.3f}  p90 {stats.p90:.3f}  p99 {stats.p99:.3f}  n={stats.count}"
                if stats
                else ""
            )
            print(f"  {phase.kind} {phase.name:<20} {phase.seconds:8.3f} s  {tail}", file=file)


async def watch_events(
    address: str,
    group: str,
    seconds: float,
    token: str = "",
    *,
    tls: TLSConfig | None = None,
    on_message: Callable[[Event], None] | None = None,
) -> list[Event]:
    """The events of `group` the scheduler's `Watch` streams within `seconds` (the initial
    SNAPSHOT messages left out). `on_message` sees every message as it arrives, SNAPSHOTs
    included (a caller can tell that the stream is open). Raises an rlslice error on RPC
    failure."""
    import asyncio

    import grpc

    from rlslice.adapters.channel import open_channel
    from rlslice.adapters.grpc_errors import error_from_rpc
    from rlslice.apps.timeline.command import event_from_proto
    from rlslice.v1alpha1 import scheduler_pb2, scheduler_pb2_grpc

    events: list[Event] = []

    async def read(stub: scheduler_pb2_grpc.SchedulerAsyncStub) -> None:
        async for message in stub.Watch(scheduler_pb2.WatchRequest(group=group)):
            event = event_from_proto(message)
            if on_message is not None:
                on_message(event)
            if event.kind != "SNAPSHOT":
                events.append(event)

    async with open_channel(address, tls=tls, token=token or None) as channel:
        stub = cast(
            "scheduler_pb2_grpc.SchedulerAsyncStub", scheduler_pb2_grpc.SchedulerStub(channel)
        )
        try:
            await asyncio.wait_for(read(stub), timeout=seconds)
        except TimeoutError:
            pass
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None
    return events


__all__ = ["print_summary", "watch_events"]
