"""`rlslice bench swap --backend cuda`: the copy paths side by side (no GPU: the backends are
stand-ins with fixed timings; the report's shape and its target are what is under test).

- where the probe says custom storage is offered, the same job moves twice more with
  copy=driver and the target `custom storage >= 5x the pageable path` is judged
- where it is not (driver 580), the report says so with the probe's words, and no target
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from rlslice.apps.bench import swap
from rlslice.snapshot_agent.backends.base import MoveOutcome

RING = "driver 615.00, CUDA 13.4; copies: the agent's pinned ring through the driver's custom storage (CUDA 13.4): 4 x 64.00 MiB buffers per move"
PAGEABLE = "driver 580.65.06, CUDA 13.0; copies: the driver's pageable staging (the driver supports CUDA 13.0; custom storage needs 13.4+)"


class Timed:
    def __init__(self, seconds: float, detail: str = "") -> None:
        self.seconds = seconds
        self.probe_detail = detail
        self.options: dict[str, str] = {}

    async def snapshot(self, job: Any, *, deadline: float) -> MoveOutcome:
        return MoveOutcome(bytes=1 << 30, seconds=self.seconds)

    async def restore(self, job: Any, *, deadline: float) -> MoveOutcome:
        return MoveOutcome(bytes=1 << 30, seconds=self.seconds)


def args() -> argparse.Namespace:
    return argparse.Namespace(
        backend="cuda", timeout=30.0, compare_cli=False, gib=1.0, swaps=3, steps=1
    )


def rounds(paths: dict[str, Any], seconds: float) -> swap._Rounds:
    found = swap._Rounds(losses={1: ["a"], 2: ["b"]})
    found.snapshots = [(1 << 30, seconds)] * 3
    found.restores = [(1 << 30, seconds)] * 3
    found.extra = {"cuda_copy_paths": paths, "workers": {"a": 1, "b": 2}}
    return found


@pytest.mark.parametrize(("pageable_s", "met"), [(0.5, True), (0.3, False)])
async def test_with_custom_storage_the_pageable_path_is_measured_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pageable_s: float, met: bool
) -> None:
    made: list[dict[str, str]] = []

    async def make(args: argparse.Namespace, state_dir: Path, **options: str) -> Timed:
        made.append(options)
        return Timed(pageable_s)

    monkeypatch.setattr(swap, "_make_backend", make)
    paths = await swap._copy_paths(args(), Timed(0.08, RING), tmp_path, job=None)
    assert made[0]["copy"] == "driver"
    assert paths["custom_storage"] is True
    assert paths["pageable"]["snapshot_seconds_median"] == pageable_s
    report = swap._report(args(), rounds(paths, 0.08), (["a"], ["b"]), {"d2h": 0.1, "h2d": 0.1})
    assert report["cuda_copy_paths"]["speedup"] == pytest.approx(pageable_s / 0.08)
    assert report["targets"]["cuda_custom_storage_at_least_5x_pageable"] is met


async def test_without_custom_storage_the_report_says_so_and_has_no_such_target(
    tmp_path: Path,
) -> None:
    paths = await swap._copy_paths(args(), Timed(1.0, PAGEABLE), tmp_path, job=None)
    assert paths["custom_storage"] is False
    assert "custom storage needs 13.4+" in paths["probe"]
    report = swap._report(args(), rounds(paths, 1.0), (["a"], ["b"]), {"d2h": 0.1, "h2d": 0.1})
    assert "cuda_custom_storage_at_least_5x_pageable" not in report["targets"]
    assert "custom storage: not offered here" in swap._text(report)
