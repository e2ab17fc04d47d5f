"""A job of a group spec declares its device state as tagged parts (issue 26, section 1).

Declared parts are read with their move class and need order; a job that declares none
has no parts (it moves whole); a bad part is refused in one line naming the field, also
through `load_group_config`; parts travel on the wire (PutGroup's GroupSpec) and a bad one
is refused there too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from rlslice.config import GroupSpec, MoveClass, first_error, load_group_config


def spec(*parts: dict[str, object]) -> GroupSpec:
    return GroupSpec.model_validate({"name": "g", "jobs": [{"name": "a", "parts": list(parts)}]})


def refusal(*parts: dict[str, object]) -> tuple[tuple[str, ...], str]:
    with pytest.raises(ValidationError) as caught:
        spec(*parts)
    return first_error(caught.value)


def test_a_job_reads_its_declared_parts_with_class_and_need_order() -> None:
    group = spec(
        {"tag": "kv_cache", "bytes": 10, "move_class": "discard"},
        {"tag": "optimizer", "bytes": 20, "need_order": 2},
    )
    kv, optimizer = group.job("a").parts
    assert (kv.tag, kv.bytes, kv.move_class) == ("kv_cache", 10, MoveClass.DISCARD)
    assert (optimizer.move_class, optimizer.need_order) == (MoveClass.OFFLOAD, 2)


def test_a_job_that_declares_nothing_has_no_parts() -> None:
    assert GroupSpec(name="g").job("b").parts == ()
    assert spec().job("a").parts == ()


def test_a_tag_listed_twice_is_refused_naming_the_parts_field() -> None:
    where, message = refusal({"tag": "kv", "bytes": 1}, {"tag": "kv", "bytes": 2})
    assert where == ("jobs", "0", "parts")
    assert message == "tag 'kv' is listed twice"


def test_a_negative_size_or_unknown_class_is_refused_naming_the_part_field() -> None:
    assert refusal({"tag": "kv", "bytes": -1})[0] == ("jobs", "0", "parts", "0", "bytes")
    where, message = refusal({"tag": "kv", "bytes": 1, "move_class": "drop"})
    assert where == ("jobs", "0", "parts", "0", "move_class")
    assert message == "must be one of discard, offload, keep_if_room"


def test_a_bad_part_in_a_group_file_is_one_line_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "groups.yaml"
    path.write_text("- name: g\n  jobs:\n  - name: a\n    parts:\n    - {tag: kv, bytes: -5}\n")
    with pytest.raises(ValueError, match=r"groups\[0\]\.jobs\.0\.parts\.0\.bytes: ") as caught:
        load_group_config(path)
    assert "\n" not in str(caught.value)


def test_declared_parts_travel_on_the_wire_and_a_bad_one_is_refused() -> None:
    from rlslice.adapters.wire import group_spec_from_proto, group_spec_to_proto

    group = spec(
        {"tag": "kv_cache", "bytes": 10, "move_class": "discard"},
        {"tag": "optimizer", "bytes": 20, "move_class": "keep_if_room", "need_order": 2},
        {"tag": "weights", "bytes": 30},
    )
    message = group_spec_to_proto(group)
    assert group_spec_from_proto(message).job("a").parts == group.job("a").parts
    message.jobs[0].parts[0].move_class = ""  # empty on the wire: the default class
    assert group_spec_from_proto(message).job("a").parts[0].move_class is MoveClass.OFFLOAD
    message.jobs[0].parts[1].bytes = -1
    with pytest.raises(ValidationError) as caught:
        group_spec_from_proto(message)
    assert first_error(caught.value) == (("bytes",), "Input should be greater than or equal to 0")
