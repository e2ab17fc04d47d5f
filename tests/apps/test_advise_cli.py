"""`rlslice profile` and `rlslice advise`, run through the CLI's entry point.

Cases:
- advise prints the ranked table (pairing, busy, slowdowns, switches/h) with the refused
  groups and the bound each breaks, and exits 0;
- the TimeSliceGroup YAML it writes validates against the CRD in the tree (unknown fields
  refused, as strict field validation does) and converts through the operator into the
  same groups; the `--group-config` YAML loads through `load_group_config`; the plot is a PNG;
- `--groups FILE`: the groups take the file's names and its hardware; a job that fits no
  GPU of it, or a placement that needs more groups than it has, exits 1 saying so;
- without `--rate-gbps`, the profiles' measured copy rate is the switch cost;
- bad input exits 2 naming it: a profile with an unknown field or a bad quantity, a size
  flag that is not a size;
- profile: a recorded log becomes a YAML profile `advise` reads; a log that is not one
  exits 2, a log where no job held the group exits 1.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from rlslice.apps.cli import main
from rlslice.apps.timeline.trace_export import Event, event_to_dict
from rlslice.config import load_group_config
from rlslice.operator.spec import group_spec

ROOT = Path(__file__).resolve().parents[2]
# Wherever the chart keeps it (crds/ or files/crds/): the CRD in the tree is the contract.
(CRD_PATH,) = ROOT.glob("charts/rlslice/**/timeslicegroups.rlslice.dev.yaml")
CRD = yaml.safe_load(CRD_PATH.read_text())
SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]

PROFILES = [
    {
        "name": "grpo-a",
        "rollout_seconds": 1.05,
        "cpu_seconds": 2.32,
        "train_seconds": 0.63,
        "state_bytes": "256Mi",
    },
    {
        "name": "grpo-b",
        "rollout_seconds": 1.05,
        "cpu_seconds": 2.32,
        "train_seconds": 0.63,
        "state_bytes": "256Mi",
    },
    {
        "name": "heavy",
        "rollout_seconds": 2.5,
        "cpu_seconds": 0.5,
        "train_seconds": 1.0,
        "state_bytes": "256Mi",
        "priority": 5,
    },
]
HARDWARE = [
    "--gpu-bytes",
    "384Mi",
    "--host-bytes",
    "4Gi",
    "--rate-gbps",
    "25",
    "--overhead-s",
    "0.02",
]


def _strict(schema: Any) -> Any:
    schema = copy.deepcopy(schema)

    def close(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node:
                node.setdefault("additionalProperties", False)
            for value in node.values():
                close(value)
        elif isinstance(node, list):
            for value in node:
                close(value)

    close(schema)
    return schema


@pytest.fixture
def profiles(tmp_path: Path) -> Path:
    path = tmp_path / "profiles.yaml"
    path.write_text(yaml.safe_dump({"profiles": PROFILES}))
    return path


def test_advise_prints_the_ranked_table_and_the_refused_groups(
    profiles: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["advise", str(profiles), *HARDWARE]) == 0
    out = capsys.readouterr().out
    for text in ("pairing", "busy", "slowdowns", "switches/h", "grpo-a + grpo-b", "heavy"):
        assert text in out
    assert "refused: demand" in out
    assert "fleet GPU busy 0.57" in out  # (0.42 + 0.42 + 0.875) / 3 jobs alone
    assert "dedicated -> 0.85" in out  # (0.83 + 0.875) / 2 groups


def test_the_group_definitions_apply_to_the_crd_and_to_group_config(
    profiles: Path, tmp_path: Path
) -> None:
    tsg, config, png = tmp_path / "tsg.yaml", tmp_path / "groups.yaml", tmp_path / "advice.png"
    argv = ["advise", str(profiles), *HARDWARE, "--backend", "cuda", "--json"]
    assert (
        main([*argv, "--tsg-out", str(tsg), "--group-config-out", str(config), "--plot", str(png)])
        == 0
    )
    resources = list(yaml.safe_load_all(tsg.read_text()))
    validator = jsonschema.Draft4Validator(_strict(SCHEMA))
    converted = []
    for resource in resources:
        assert resource["kind"] == "TimeSliceGroup"
        validator.validate(resource)
        converted.append(group_spec(resource["metadata"]["name"], resource["spec"]))
    loaded = load_group_config(config)
    assert [(g.name, g.backend, [j.name for j in g.jobs]) for g in converted] == [
        (g.name, g.backend, [j.name for j in g.jobs]) for g in loaded
    ]
    assert sorted([j.name for j in g.jobs] for g in loaded) == [["grpo-a", "grpo-b"], ["heavy"]]
    assert {g.backend for g in loaded} == {"cuda"}
    assert [g.jobs[0].priority for g in loaded if g.jobs[0].name == "heavy"] == [5]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_headroom_selector_and_weights_are_written_as_the_crd_spells_them(
    tmp_path: Path,
) -> None:
    weighted = [{**p, "weight": 3.0} for p in PROFILES]
    path = tmp_path / "weighted.yaml"
    path.write_text(yaml.safe_dump({"profiles": weighted}))
    groups = tmp_path / "groups.yaml"
    groups.write_text(yaml.safe_dump([{"name": "rack-1", "node_selector": {"pool": "a100"}}]))
    tsg = tmp_path / "tsg.yaml"
    argv = ["advise", str(path), *HARDWARE, "--headroom-bytes", "1Mi", "--json"]
    assert main([*argv, "--groups", str(groups), "--tsg-out", str(tsg)]) == 1  # 2 groups needed
    validator = jsonschema.Draft4Validator(_strict(SCHEMA))
    resources = list(yaml.safe_load_all(tsg.read_text()))
    for resource in resources:
        validator.validate(resource)
        spec = group_spec(resource["metadata"]["name"], resource["spec"])
        assert spec.headroom_bytes == 1 << 20
        assert {j.weight for j in spec.jobs} == {3.0}
    rack = group_spec("rack-1", resources[0]["spec"])
    assert rack.node_selector == {"pool": "a100"}


def test_a_groups_file_names_the_groups_and_sets_the_hardware(
    profiles: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    groups = tmp_path / "groups.yaml"
    groups.write_text(
        yaml.safe_dump(
            {
                "groups": [
                    {
                        "name": "rack-1",
                        "gpu_bytes": "384Mi",
                        "host_bytes": "4Gi",
                        "rate_gbps": 25,
                        "backend": "app",
                    },
                    {"name": "rack-2"},
                ]
            }
        )
    )
    assert main(["advise", str(profiles), "--groups", str(groups), "--json"]) == 0
    advice = json.loads(capsys.readouterr().out)
    assert [g["name"] for g in advice["groups"]] == ["rack-1", "rack-2"]
    assert advice["bandwidth_bytes_per_s"] == 25e9
    small = tmp_path / "small.yaml"
    small.write_text(yaml.safe_dump([{"name": "tiny", "gpu_bytes": "128Mi"}]))
    assert main(["advise", str(profiles), "--groups", str(small), "--json"]) == 1
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert any("(device memory)" in p for p in problems)
    one = tmp_path / "one.yaml"
    one.write_text(yaml.safe_dump([{"name": "only", "gpu_bytes": "384Mi"}]))
    assert main(["advise", str(profiles), "--groups", str(one), "--json"]) == 1
    assert "only 1 are available" in capsys.readouterr().out


def test_the_measured_copy_rate_is_the_switch_cost_without_a_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    measured = [
        {**p, "switching": {"switches": 3, "bandwidth_bytes_per_s": 2.5e9}} for p in PROFILES[:2]
    ]
    path = tmp_path / "measured.yaml"
    path.write_text(yaml.safe_dump({"profiles": measured}))
    assert main(["advise", str(path), "--gpu-bytes", "384Mi", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bandwidth_bytes_per_s"] == 2.5e9


def test_bad_input_exits_2_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**PROFILES[0], "colour": "red"}))
    assert main(["advise", str(path)]) == 2
    assert "colour" in capsys.readouterr().err
    path.write_text(yaml.safe_dump({**PROFILES[0], "state_bytes": "lots"}))
    assert main(["advise", str(path)]) == 2
    assert "256Mi or 16Gi" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["advise", str(path), "--gpu-bytes", "plenty"])
    assert exited.value.code == 2
    assert "'plenty' is not a size" in capsys.readouterr().err


def _log(tmp_path: Path, events: list[Event]) -> Path:
    path = tmp_path / "events.json"
    path.write_text(json.dumps({"events": [event_to_dict(e) for e in events]}))
    return path


def test_profile_turns_a_recorded_log_into_a_profile_advise_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events, now, seq = [], 1000.0, 0
    for _ in range(5):
        for phase, hold, gap in (("rollout", 1.0, 2.0), ("train", 0.5, 0.01)):
            for kind, at in (("QUEUED", now), ("GRANTED", now), ("YIELDED", now + hold)):
                seq += 1
                events.append(
                    Event(
                        time=at,
                        group="solo",
                        kind=kind,
                        job="grpo-a",
                        detail=phase if kind != "YIELDED" else "",
                        seq=seq,
                    )
                )
            now += hold + gap
    out = tmp_path / "grpo-a.yaml"
    log = _log(tmp_path, events)
    assert (
        main(
            [
                "profile",
                "--from-log",
                str(log),
                "--state-bytes",
                "256Mi",
                "--max-slowdown",
                "1.3",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert "grpo-a: cycle 3.510 s" in capsys.readouterr().out
    (profile,) = yaml.safe_load(out.read_text())["profiles"]
    assert profile["state_bytes"] == 256 << 20
    assert profile["max_slowdown"] == 1.3
    assert [p["name"] for p in profile["phases"]] == [
        "rollout",
        "after-rollout",
        "train",
        "after-train",
    ]
    assert main(["advise", str(out), "--gpu-bytes", "384Mi", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["groups"][0]["jobs"] == ["grpo-a"]


def test_profile_refuses_a_log_that_is_not_one_and_says_when_no_job_held(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"events": 3}')
    assert main(["profile", "--from-log", str(bad)]) == 2
    assert "expected a list of events" in capsys.readouterr().err
    empty = _log(tmp_path, [Event(time=1.0, group="g", kind="REGISTERED", job="a")])
    assert main(["profile", "--from-log", str(empty)]) == 1
    assert "no job held" in capsys.readouterr().err


def test_profile_watch_refuses_a_window_that_is_not_positive_before_connecting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # An address nothing listens on: the refusal comes before any connection.
    assert main(["profile", "--watch", "g", "--seconds", "0", "--scheduler", "127.0.0.1:9"]) == 2
    assert capsys.readouterr().err == "profile: --seconds: must be positive\n"
