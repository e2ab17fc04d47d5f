"""`rlslice timeline` from a recorded event log: the files it writes and the input it refuses.

Case matrix:

| arguments | checked |
|---|---|
| `--from-log events.json --out t.json --out t.png` | the trace equals the pure export of the log; the PNG is a PNG of sensible size |
| `--save-log` | the saved log reads back to the same events |
| proto messages vs their JSON form | `event_from_proto` and the JSON reader agree |
| a proto event whose status lists a partly parked job (issue 26) | its parts kept, the same from the JSON form; `--save-log` keeps them |
| no `--out`, a `.txt` `--out`, a missing or malformed log, a negative `--limit` | exit 2, one line naming the flag |
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from google.protobuf import json_format

from rlslice.apps.cli import main
from rlslice.apps.timeline.command import event_from_proto
from rlslice.apps.timeline.trace_export import (
    JobParts,
    build_timeline,
    chrome_trace,
    event_to_dict,
    events_from_json,
)
from rlslice.v1alpha1 import scheduler_pb2

FIXTURE = Path(__file__).parent / "fixtures" / "events.json"


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_a_recorded_log_becomes_a_chrome_trace_and_a_png(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace_path, png_path = tmp_path / "g1.json", tmp_path / "g1.png"
    code = main(
        [
            "timeline",
            "g1",
            "--from-log",
            str(FIXTURE),
            "--out",
            str(trace_path),
            "--out",
            str(png_path),
        ]
    )
    assert code == 0
    expected = chrome_trace(build_timeline(events_from_json(json.loads(FIXTURE.read_text())), "g1"))
    assert json.loads(trace_path.read_text()) == expected
    width, height = png_size(png_path)
    assert 800 <= width <= 2000
    assert 200 <= height <= 1200
    assert png_path.stat().st_size > 10_000  # drawn, not blank
    assert f"wrote {png_path}" in capsys.readouterr().out


def test_the_saved_log_reads_back_to_the_same_events(tmp_path: Path) -> None:
    saved = tmp_path / "saved.json"
    code = main(
        [
            "timeline",
            "g1",
            "--from-log",
            str(FIXTURE),
            "--save-log",
            str(saved),
            "--out",
            str(tmp_path / "t.json"),
        ]
    )
    assert code == 0
    original = events_from_json(json.loads(FIXTURE.read_text()))
    assert events_from_json(json.loads(saved.read_text())) == original


def test_proto_events_and_their_json_form_read_the_same() -> None:
    message = scheduler_pb2.GetEventsResponse(
        events=[
            scheduler_pb2.GroupEvent(
                time=1.25,
                group="g1",
                kind=scheduler_pb2.EVENT_KIND_SWITCH_DONE,
                job="b",
                epoch=2**40,
                seconds=0.5,
                bytes=3 * 2**30,
                detail="node-1",
                seq=17,
                status=scheduler_pb2.GroupStatus(holder="a"),
            )
        ]
    )
    as_json = json.loads(json_format.MessageToJson(message))
    assert events_from_json(as_json) == [event_from_proto(message.events[0])]
    assert event_from_proto(message.events[0]).kind == "SWITCH_DONE"


def test_a_proto_event_keeps_the_parts_its_status_lists() -> None:
    jobs = [
        scheduler_pb2.JobStatus(job="a", parked_parts=["p3"], discarded_parts=["p0"]),
        scheduler_pb2.JobStatus(job="b"),
    ]
    message = scheduler_pb2.GetEventsResponse(
        events=[
            scheduler_pb2.GroupEvent(
                time=2.0,
                group="g1",
                kind=scheduler_pb2.EVENT_KIND_SWITCH_DONE,
                job="b",
                status=scheduler_pb2.GroupStatus(parked=["a"], jobs=jobs),
            )
        ]
    )
    event = event_from_proto(message.events[0])
    assert event.parts == (JobParts("a", ("p3",), ("p0",)),)
    assert events_from_json(json.loads(json_format.MessageToJson(message))) == [event]
    saved = json.loads(json.dumps({"events": [event_to_dict(event)]}))
    assert events_from_json(saved) == [event]


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ([], "--out: give at least one"),
        (["--out", "t.txt"], "--out: t.txt: suffix must be .json or .png"),
        (["--out", "t.json", "--limit", "-1"], "--limit: must be 0 or more"),
        (["--out", "t.json", "--from-log", "missing.json"], "--from-log: missing.json"),
        (["--out", "t.json", "--from-log", "bad.json"], "--from-log: bad.json"),
    ],
)
def test_bad_arguments_exit_2_naming_the_flag(
    extra: list[str],
    fragment: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.json").write_text('{"events": "nope"}')
    assert main(["timeline", "g1", *extra]) == 2
    err = capsys.readouterr().err
    assert fragment in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "t.json").exists()
