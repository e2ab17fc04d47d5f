"""Phase kinds and the RL policies in the kernel's group spec and `--group-config` YAML.

Cases: a YAML group declares phases (kind, expected seconds), the lrs/stage policy, the
aging bound and early yield; defaults keep today's behaviour (no phases, early yield on,
300 s aging); a bad kind, a negative duration, a zero aging bound and a bad phase name are
refused in one line naming the file and the field.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlslice.config import (
    DEFAULT_STAGE_AGING_SECONDS,
    GroupSpec,
    PhaseKind,
    Policy,
    load_group_config,
)

GOOD = """\
groups:
  - name: rl
    policy: stage
    stage_aging_seconds: 120
    phases:
      rollout: {kind: rollout, expected_seconds: 90}
      train: {kind: train, expected_seconds: 30}
      sync: {kind: sync}
  - name: plain
    policy: lrs
"""


def test_a_group_config_declares_phase_kinds_and_an_rl_policy(tmp_path: Path) -> None:
    path = tmp_path / "groups.yaml"
    path.write_text(GOOD)
    rl, plain = load_group_config(path)
    assert rl.policy is Policy.STAGE
    assert rl.stage_aging_seconds == 120
    assert rl.phase_kind("rollout") is PhaseKind.ROLLOUT
    assert rl.phase_kind("train") is PhaseKind.TRAIN
    assert rl.phase_kind("sync") is PhaseKind.SYNC
    assert rl.phase_kind("eval") is None  # undeclared: no kind, as before
    assert rl.phases["rollout"].expected_seconds == 90
    assert plain.policy is Policy.LRS
    assert (plain.phases, plain.early_yield) == ({}, True)
    assert plain.stage_aging_seconds == DEFAULT_STAGE_AGING_SECONDS == 300


@pytest.mark.parametrize(
    ("group", "message"),
    [
        (
            "{name: rl, phases: {rollout: {kind: generate}}}",
            "groups[0].phases.rollout.kind: must be one of rollout, train, sync",
        ),
        (
            "{name: rl, phases: {rollout: {expected_seconds: 3}}}",
            "groups[0].phases.rollout.kind: Field required",
        ),
        (
            "{name: rl, phases: {train: {kind: train, expected_seconds: -1}}}",
            "groups[0].phases.train.expected_seconds: Input should be greater than or equal to 0",
        ),
        (
            "{name: rl, stage_aging_seconds: 0}",
            "groups[0].stage_aging_seconds: Input should be greater than 0",
        ),
        ("{name: rl, policy: lru}", "groups[0].policy: Input should be"),
    ],
)
def test_a_bad_phase_or_policy_is_refused_naming_the_field(
    tmp_path: Path, group: str, message: str
) -> None:
    path = tmp_path / "groups.yaml"
    path.write_text(f"[{group}]\n")
    with pytest.raises(ValueError, match="groups") as raised:
        load_group_config(path)
    text = str(raised.value)
    assert text.startswith(f"{path}: {message}"), text
    assert "\n" not in text


def test_a_phase_name_must_be_printable_and_short() -> None:
    with pytest.raises(ValueError, match="phases: "):
        GroupSpec(name="rl", phases={"x" * 64: {"kind": "train"}})  # type: ignore[dict-item]
