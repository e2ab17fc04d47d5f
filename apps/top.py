"""`rlslice top`: a live terminal view of every group, fed by the scheduler's `Watch` stream.

Three layers, so each can be tested alone:

- plain data: `TopState` (groups, recent switches), folded from events by `fold()` — pure;
- `render(state, now)`: a rich renderable (tables of groups and of recent switches) — pure;
- the stream loop: `follow()` reads `Watch` (the first messages are one SNAPSHOT per group,
  then every event with the group's state after it) and calls back on each new state; `run()`
  draws with rich `Live`. The screen redraws when an event arrives (at most every
  `--refresh` seconds) and on a local timer so "held for" ages; the scheduler is never polled.

`--once` prints one picture after the initial snapshots; `--iterations N` stops after N
stream messages (both for scripts and tests).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, cast

from rlslice.apps.shared.flags import ConnectionFlags, add_connection_flags, connection_from
from rlslice.apps.timeline.trace_export import Event
from rlslice.units import format_bytes

if TYPE_CHECKING:
    import grpc
    from rich.console import Console, RenderableType

    from rlslice.v1alpha1 import scheduler_pb2

RECENT_SWITCHES = 8


@dataclass(frozen=True)
class JobRow:
    """One job's place in a group, as `top` shows it."""

    job: str
    state: str
    """"HOLDING", "RESIDENT", "PARKED", "FAULTED", "IDLE"."""
    device_bytes: int = 0
    held_seconds: float = 0.0
    queue_position: int = 0
    reason: str = ""


@dataclass(frozen=True)
class GroupView:
    """A group's state after the latest event (the `status` of a `GroupEvent`)."""

    name: str
    phase: str = ""
    holder: str = ""
    holder_since: float = 0.0
    queue: tuple[str, ...] = ()
    resident: tuple[str, ...] = ()
    parked: tuple[str, ...] = ()
    epoch: int = 0
    busy_fraction: float = 0.0
    last_switch_seconds: float = 0.0
    switches: int = 0
    jobs: tuple[JobRow, ...] = ()

    def bytes_of(self, job: str) -> int:
        """Device bytes last reported for `job`, 0 when unknown."""
        for view in self.jobs:
            if view.job == job:
                return view.device_bytes
        return 0


@dataclass(frozen=True)
class SwitchView:
    """A finished switch (SWITCH_DONE or SWITCH_FAILED)."""

    time: float
    group: str
    job: str
    """The incoming job."""
    seconds: float
    bytes: int
    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class TopState:
    """Everything `top` shows; built only by `fold`."""

    groups: Mapping[str, GroupView] = field(default_factory=dict)
    switches: tuple[SwitchView, ...] = ()
    """Most recent last, at most `RECENT_SWITCHES`."""
    events: int = 0
    """Stream messages folded so far (snapshots included)."""
    last_seq: int = 0
    last_time: float = 0.0
    note: str = ""
    """A line about the connection ("reconnecting: ..."), empty when all is well."""


def fold(state: TopState, event: Event, status: GroupView | None) -> TopState:
    """The state after `event` (with the group's `status` after it, when the event carries one)."""
    groups = state.groups
    if event.kind == "GROUP_DELETED":
        groups = {k: v for k, v in groups.items() if k != event.group}
    elif status is not None:
        groups = {**groups, event.group: status}
    switches = state.switches
    if event.kind in ("SWITCH_DONE", "SWITCH_FAILED"):
        done = SwitchView(
            event.time,
            event.group,
            event.job,
            event.seconds,
            event.bytes,
            event.kind == "SWITCH_DONE",
            event.detail,
        )
        switches = (*switches, done)[-RECENT_SWITCHES:]
    return replace(
        state,
        groups=groups,
        switches=switches,
        events=state.events + 1,
        last_seq=max(state.last_seq, event.seq),
        last_time=max(state.last_time, event.time),
        note="",
    )


def human_bytes(count: int) -> str:
    """Bytes in IEC units with one decimal (the table's columns are narrow): 1.5 KiB, 2.0 GiB."""
    return format_bytes(count, decimals=1)


def _jobs_with_bytes(group: GroupView, jobs: tuple[str, ...]) -> str:
    return "\n".join(
        f"{job} {human_bytes(group.bytes_of(job))}" if group.bytes_of(job) else job for job in jobs
    )


def _age(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def render(
    state: TopState, now: float, *, max_groups: int | None = None, title: str = "rlslice top"
) -> RenderableType:
    """The picture of `state` at Unix time `now`: a table of groups and one of recent switches."""
    from rich.console import Group
    from rich.text import Text

    groups = sorted(state.groups.values(), key=lambda g: g.name)
    held = sum(1 for g in groups if g.holder)
    waiting = sum(len(g.queue) for g in groups)
    header = Text(
        f"{title} · {len(groups)} groups, {held} held, {waiting} waiting · {state.events} events",
        style="bold",
    )
    shown = groups if max_groups is None else groups[:max_groups]
    parts: list[RenderableType] = [header, _groups_table(shown, now)]
    if len(shown) < len(groups):
        parts.append(Text(f"… {len(groups) - len(shown)} more groups (use --group)"))
    if state.switches:
        parts.append(_switches_table(state.switches, now))
    if state.note:
        parts.append(Text(state.note, style="yellow"))
    return Group(*parts)


_GROUP_COLUMNS = (
    ("GROUP", "left"),
    ("PHASE", "left"),
    ("EPOCH", "right"),
    ("HOLDER", "left"),
    ("QUEUE", "left"),
    ("RESIDENT", "left"),
    ("PARKED", "left"),
    ("BUSY", "right"),
    ("SWITCHES", "right"),
)


def _groups_table(groups: Sequence[GroupView], now: float) -> RenderableType:
    from rich.table import Table

    table = Table(expand=True, show_lines=False, pad_edge=False)
    for name, justify in _GROUP_COLUMNS:
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for group in groups:
        holder = group.holder
        if holder and group.holder_since > 0:
            holder = f"{holder} ({_age(max(0.0, now - group.holder_since))})"
        table.add_row(
            group.name,
            group.phase,
            str(group.epoch),
            holder or "-",
            " → ".join(group.queue) or "-",
            _jobs_with_bytes(group, group.resident) or "-",
            _jobs_with_bytes(group, group.parked) or "-",
            f"{group.busy_fraction * 100:.0f}%",
            f"{group.switches}"
            + (f" (last {group.last_switch_seconds:.2f}s)" if group.switches else ""),
        )
    return table


def _switches_table(switches: Sequence[SwitchView], now: float) -> RenderableType:
    from rich.table import Table

    recent = Table(title="recent switches", expand=True, pad_edge=False)
    for name in ("AGO", "GROUP", "TO", "SECONDS", "MOVED", "GB/s", "OUTCOME"):
        recent.add_column(name)
    for switch in reversed(switches):
        rate = switch.bytes / switch.seconds / 1e9 if switch.seconds > 0 else 0.0
        recent.add_row(
            _age(max(0.0, now - switch.time)),
            switch.group,
            switch.job,
            f"{switch.seconds:.3f}",
            human_bytes(switch.bytes),
            f"{rate:.2f}" if rate else "-",
            "ok" if switch.ok else f"failed: {switch.detail}",
        )
    return recent


# --- adapter: protobuf -> plain data -------------------------------------------------------


def group_view_from_proto(status: scheduler_pb2.GroupStatus) -> GroupView:
    """The plain view of a `GroupStatus`."""
    from rlslice.v1alpha1 import scheduler_pb2

    return GroupView(
        name=status.spec.name,
        phase=status.phase,
        holder=status.holder,
        holder_since=status.holder_since,
        queue=tuple(status.queue),
        resident=tuple(status.resident),
        parked=tuple(status.parked),
        epoch=status.epoch,
        busy_fraction=status.busy_fraction,
        last_switch_seconds=status.last_switch_seconds,
        switches=status.switches,
        jobs=tuple(
            JobRow(
                job=j.job,
                state=scheduler_pb2.JobState.Name(j.state).removeprefix("JOB_STATE_"),
                device_bytes=j.device_bytes,
                held_seconds=j.held_seconds,
                queue_position=j.queue_position,
                reason=j.reason,
            )
            for j in status.jobs
        ),
    )


def fold_message(state: TopState, message: scheduler_pb2.GroupEvent) -> TopState:
    """`fold` for a `GroupEvent` off the wire."""
    from rlslice.apps.timeline.command import event_from_proto

    status = None
    if message.HasField("status"):
        status = group_view_from_proto(message.status)
        if not status.name:  # a status without its spec still belongs to the event's group
            status = replace(status, name=message.group)
    return fold(state, event_from_proto(message), status)


async def follow(
    channel: grpc.aio.Channel,
    group: str = "",
    *,
    on_state: Callable[[TopState], None] | None = None,
    stop: Callable[[TopState], bool] | None = None,
    max_messages: int | None = None,
    state: TopState | None = None,
) -> TopState:
    """Fold the `Watch` stream of `group` ("" for all) until `stop(state)` holds, `max_messages`
    have been read, or the stream ends; return the last state. RPC errors propagate."""
    from rlslice.v1alpha1 import scheduler_pb2, scheduler_pb2_grpc

    stub = cast("scheduler_pb2_grpc.SchedulerAsyncStub", scheduler_pb2_grpc.SchedulerStub(channel))
    current = state or TopState()
    read = 0
    call = stub.Watch(scheduler_pb2.WatchRequest(group=group))
    try:
        async for message in call:
            current = fold_message(current, message)
            read += 1
            if on_state is not None:
                on_state(current)
            if (stop is not None and stop(current)) or (
                max_messages is not None and read >= max_messages
            ):
                break
    finally:
        call.cancel()
    return current


async def snapshot(channel: grpc.aio.Channel, group: str = "") -> TopState:
    """The state right after the initial SNAPSHOT messages of a `Watch` (for `--once`)."""
    from rlslice.v1alpha1 import scheduler_pb2, scheduler_pb2_grpc

    stub = cast("scheduler_pb2_grpc.SchedulerAsyncStub", scheduler_pb2_grpc.SchedulerStub(channel))
    if group:
        expected = 1
    else:
        expected = len((await stub.ListGroups(scheduler_pb2.ListGroupsRequest())).groups)
    if expected == 0:
        return TopState()
    return await follow(channel, group, max_messages=expected)


# --- the command ------------------------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    add_connection_flags(parser)
    parser.add_argument("--group", default="", help="show only this group")
    parser.add_argument("--once", action="store_true", help="print the current state once and exit")
    parser.add_argument(
        "--iterations", type=int, default=0, help="exit after this many stream messages (0: never)"
    )
    parser.add_argument(
        "--refresh", type=float, default=0.5, help="seconds between redraws at most (default 0.5)"
    )
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds for --once")


def run(args: argparse.Namespace) -> int:
    import asyncio
    import sys

    import grpc
    from rich.console import Console

    from rlslice._ids import validate_id
    from rlslice.adapters.grpc_errors import error_from_rpc

    if args.group:
        try:
            validate_id(args.group, "--group")
        except ValueError as error:
            print(f"top: {error}", file=sys.stderr)
            return 2
    if args.iterations < 0:
        print("top: --iterations: must be 0 or more", file=sys.stderr)
        return 2
    if args.refresh <= 0:
        print("top: --refresh: must be above 0", file=sys.stderr)
        return 2
    from rlslice._errors import InvalidArgumentError

    try:
        connection = connection_from(args)
    except InvalidArgumentError as error:
        print(f"top: {error}", file=sys.stderr)
        return 2
    console = Console()
    try:
        return asyncio.run(_main(connection, args, console))
    except grpc.RpcError as error:
        print(f"top: {connection.address}: {error_from_rpc(error)}", file=sys.stderr)
    except TimeoutError:
        print(f"top: {connection.address}: no snapshot within {args.timeout:g} s", file=sys.stderr)
    return 1


async def _main(connection: ConnectionFlags, args: argparse.Namespace, console: Console) -> int:
    import asyncio

    from rich.live import Live

    from rlslice.adapters.channel import open_channel

    title = f"rlslice top · {connection.address}"
    async with open_channel(
        connection.address, tls=connection.tls, token=connection.token
    ) as channel:
        if args.once:
            state = await asyncio.wait_for(snapshot(channel, args.group), args.timeout)
            console.print(render(state, time.time(), title=title))
            return 0
        with Live(console=console, auto_refresh=False, transient=False) as live:
            drawn = 0.0
            latest = TopState()

            def draw(state: TopState, force: bool = False) -> None:
                nonlocal drawn, latest
                latest = state
                if force or time.monotonic() - drawn >= args.refresh:
                    rows = max(console.size.height - 12, 5)
                    live.update(
                        render(state, time.time(), max_groups=rows, title=title), refresh=True
                    )
                    drawn = time.monotonic()

            async def tick() -> None:  # ages the clocks and flushes throttled updates
                while True:
                    await asyncio.sleep(args.refresh)
                    draw(latest, force=True)

            ticker = asyncio.create_task(tick())
            try:
                await _follow_forever(channel, args, draw)
            finally:
                ticker.cancel()
            draw(latest, force=True)
    return 0


async def _follow_forever(
    channel: grpc.aio.Channel, args: argparse.Namespace, draw: Callable[[TopState], None]
) -> None:
    """Follow the stream; reconnect with backoff while the scheduler is away (not in tests)."""
    import asyncio

    import grpc

    backoff = 0.5
    kept = TopState()

    def seen(state: TopState) -> None:
        nonlocal kept
        kept = state
        draw(state)

    while True:
        try:
            # A fresh stream starts from snapshots: forget groups, keep the switch history.
            final = await follow(
                channel,
                args.group,
                on_state=seen,
                max_messages=args.iterations or None,
                state=TopState(switches=kept.switches),
            )
            if args.iterations:
                return
            backoff = 0.5
            draw(replace(final, note="stream ended; reconnecting"))
        except grpc.aio.AioRpcError as error:
            if args.iterations or error.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            draw(replace(kept, note=f"reconnecting: {error.details()}"))
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, 10.0)
