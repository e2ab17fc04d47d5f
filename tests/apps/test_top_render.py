"""`rlslice top`: the state fold and the rendered picture (through rich's console capture).

Case matrix:

| input | checked |
|---|---|
| two groups, one held with a queue, jobs resident and parked with bytes | holder with its age, queue in serving order, bytes in IEC units, busy %, epoch, phase |
| SWITCH_DONE / SWITCH_FAILED events | the recent-switches table: group, incoming job, seconds, bytes, GB/s, failure reason |
| more switches than kept | only the newest `RECENT_SWITCHES`, newest last |
| GROUP_DELETED | the group leaves the picture |
| an event without status | the group's last state stays |
| more groups than rows | a "… N more groups" line |
| a `GroupStatus` message | `group_view_from_proto` keeps every field `top` shows |
| byte counts | `human_bytes` table |
"""

from __future__ import annotations

import io

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from rlslice.apps.timeline.trace_export import Event
from rlslice.apps.top import (
    RECENT_SWITCHES,
    GroupView,
    JobRow,
    TopState,
    fold,
    group_view_from_proto,
    human_bytes,
    render,
)
from rlslice.v1alpha1 import scheduler_pb2

GiB = 1024**3
NOW = 1_700_000_100.0


def text_of(state: TopState, *, width: int = 200, **kwargs: object) -> str:
    console = Console(record=True, width=width, color_system=None, file=io.StringIO())
    console.print(render(state, NOW, **kwargs))  # type: ignore[arg-type]
    return console.export_text()


def busy_group() -> GroupView:
    return GroupView(
        name="gpu-0",
        phase="Held",
        holder="actor-a",
        holder_since=NOW - 42,
        queue=("learner", "actor-b"),
        resident=("actor-a", "learner"),
        parked=("actor-b",),
        epoch=17,
        busy_fraction=0.734,
        last_switch_seconds=0.42,
        switches=9,
        jobs=(
            JobRow("actor-a", "HOLDING", device_bytes=int(1.5 * GiB)),
            JobRow("learner", "RESIDENT", device_bytes=512 * 1024**2),
            JobRow("actor-b", "PARKED", device_bytes=20 * GiB),
        ),
    )


def state_with(*groups: GroupView) -> TopState:
    state = TopState()
    for seq, group in enumerate(groups, start=1):
        state = fold(state, Event(time=NOW - 60, group=group.name, kind="SNAPSHOT", seq=seq), group)
    return state


def test_the_picture_shows_holder_queue_order_bytes_and_busy_fraction() -> None:
    text = text_of(state_with(busy_group(), GroupView(name="gpu-1", phase="Idle")))
    row = next(line for line in text.splitlines() if "gpu-0" in line)
    assert "actor-a (42s)" in row
    assert "learner → actor-b" in row
    assert row.index("learner → actor-b") < row.index("73%")
    assert "73%" in row
    assert " 17 " in row
    assert "Held" in row
    assert "9 (last 0.42s)" in row
    assert "actor-a 1.5 GiB" in text
    assert "learner 512.0 MiB" in text
    assert "actor-b 20.0 GiB" in text
    idle = next(line for line in text.splitlines() if "gpu-1" in line)
    assert "Idle" in idle
    assert "2 groups, 1 held, 2 waiting" in text


def test_recent_switches_show_seconds_bytes_and_failures() -> None:
    state = state_with(busy_group())
    state = fold(
        state,
        Event(
            time=NOW - 5,
            group="gpu-0",
            kind="SWITCH_DONE",
            job="actor-a",
            seconds=0.5,
            bytes=4 * 10**9,
        ),
        None,
    )
    state = fold(
        state,
        Event(
            time=NOW - 2,
            group="gpu-0",
            kind="SWITCH_FAILED",
            job="learner",
            seconds=0.9,
            detail="restore failed on n1",
        ),
        None,
    )
    text = text_of(state)
    assert "recent switches" in text
    done = next(line for line in text.splitlines() if "0.500" in line)
    assert "actor-a" in done
    assert "3.7 GiB" in done
    assert "8.00" in done  # GB/s
    assert "ok" in done
    failed = next(line for line in text.splitlines() if "0.900" in line)
    assert "failed: restore failed on n1" in failed
    assert text.index("0.900") < text.index("0.500")  # newest first


def test_only_the_newest_switches_are_kept() -> None:
    state = TopState()
    for n in range(RECENT_SWITCHES + 5):
        state = fold(state, Event(time=float(n), group="g", kind="SWITCH_DONE", job=f"j{n}"), None)
    assert len(state.switches) == RECENT_SWITCHES
    assert [s.job for s in state.switches][-1] == f"j{RECENT_SWITCHES + 4}"
    assert state.switches[0].job == "j5"


def test_a_deleted_group_leaves_the_picture() -> None:
    state = state_with(busy_group(), GroupView(name="gpu-1"))
    state = fold(
        state, Event(time=NOW, group="gpu-0", kind="GROUP_DELETED", seq=99), GroupView(name="gpu-0")
    )
    assert set(state.groups) == {"gpu-1"}
    assert "gpu-0" not in text_of(state)
    assert state.last_seq == 99


def test_an_event_without_status_keeps_the_groups_last_state() -> None:
    state = state_with(busy_group())
    after = fold(state, Event(time=NOW, group="gpu-0", kind="SNAPSHOT_DONE", seq=5), None)
    assert after.groups == state.groups
    assert after.events == state.events + 1


def test_more_groups_than_rows_are_summarised() -> None:
    state = state_with(*(GroupView(name=f"g{n:03}") for n in range(30)))
    text = text_of(state, max_groups=10)
    assert "g009" in text
    assert "g010" not in text
    assert "… 20 more groups" in text


def test_a_group_status_message_becomes_a_view_with_every_shown_field() -> None:
    status = scheduler_pb2.GroupStatus(
        spec=scheduler_pb2.GroupSpec(name="gpu-0"),
        holder="a",
        queue=["c", "b"],
        resident=["a"],
        parked=["b", "c"],
        epoch=4,
        busy_fraction=0.5,
        last_switch_seconds=0.25,
        switches=3,
        phase="Held",
        holder_since=123.0,
        jobs=[
            scheduler_pb2.JobStatus(job="a", state=scheduler_pb2.JOB_STATE_HOLDING, device_bytes=7),
            scheduler_pb2.JobStatus(
                job="b", state=scheduler_pb2.JOB_STATE_PARKED, queue_position=2
            ),
        ],
    )
    view = group_view_from_proto(status)
    assert view == GroupView(
        name="gpu-0",
        phase="Held",
        holder="a",
        holder_since=123.0,
        queue=("c", "b"),
        resident=("a",),
        parked=("b", "c"),
        epoch=4,
        busy_fraction=0.5,
        last_switch_seconds=0.25,
        switches=3,
        jobs=(JobRow("a", "HOLDING", device_bytes=7), JobRow("b", "PARKED", queue_position=2)),
    )


@pytest.mark.parametrize(
    ("count", "shown"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (5 * 1024**2, "5.0 MiB"),
        (int(1.5 * GiB), "1.5 GiB"),
        (3 * 1024**4, "3.0 TiB"),
        (2048 * 1024**4, "2.0 PiB"),  # PiB, the one formatter's largest unit (it was TiB here)
    ],
)
def test_bytes_are_shown_in_iec_units(count: int, shown: str) -> None:
    assert human_bytes(count) == shown


@given(
    st.lists(st.sampled_from(["SNAPSHOT", "GRANTED", "SWITCH_DONE", "GROUP_DELETED"]), max_size=40)
)
def test_the_fold_counts_every_message_and_keeps_only_live_groups(kinds: list[str]) -> None:
    state = TopState()
    alive: set[str] = set()
    for n, kind in enumerate(kinds):
        name = f"g{n % 3}"
        state = fold(
            state, Event(time=float(n), group=name, kind=kind, seq=n), GroupView(name=name)
        )
        if kind == "GROUP_DELETED":
            alive.discard(name)
        else:
            alive.add(name)
    assert state.events == len(kinds)
    assert set(state.groups) == alive
    assert len(state.switches) <= RECENT_SWITCHES
