"""The host-memory guard.

Case matrix:
- refusal(): fits / exceeds host available / eaten by the reserve / exceeds a cgroup limit
- cgroup_headrooms(): a fixture /proc + /sys/fs/cgroup tree: v2 limits found, the tightest
  ancestor wins, "max" means no limit, processes without /proc entries are skipped, each
  cgroup counted once
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlslice.snapshot_agent.memguard import CgroupHeadroom, cgroup_headrooms, refusal

GiB = 1 << 30


@pytest.mark.parametrize(
    ("nbytes", "available", "reserve", "cgroups", "refused"),
    [
        (1 * GiB, 4 * GiB, 1 * GiB, [], False),
        (4 * GiB, 4 * GiB, 0, [], False),
        (5 * GiB, 4 * GiB, 0, [], True),
        (3 * GiB, 4 * GiB, 2 * GiB, [], True),
        (1 * GiB, 8 * GiB, 0, [CgroupHeadroom("/job", 4 * GiB, 3 * GiB)], False),
        (2 * GiB, 8 * GiB, 0, [CgroupHeadroom("/job", 4 * GiB, 3 * GiB)], True),
    ],
)
def test_a_snapshot_is_refused_exactly_when_host_memory_cannot_take_it(
    nbytes: int, available: int, reserve: int, cgroups: list[CgroupHeadroom], refused: bool
) -> None:
    reason = refusal("job-a", nbytes, host_available=available, reserve=reserve, cgroups=cgroups)
    assert (reason is not None) is refused
    if reason is not None:
        assert reason.startswith("host memory:")
        assert "job-a" in reason


def test_the_refusal_names_the_cgroup_that_is_short() -> None:
    reason = refusal(
        "job-a",
        2 * GiB,
        host_available=64 * GiB,
        reserve=0,
        cgroups=[CgroupHeadroom("/kubepods/pod1", 4 * GiB, 3 * GiB)],
    )
    assert reason is not None
    assert "/kubepods/pod1" in reason


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    proc, cgroup = tmp_path / "proc", tmp_path / "cgroup"
    for pid, path in {
        "10": "/kubepods/pod1/c1",
        "11": "/kubepods/pod1/c1",
        "12": "/free",
    }.items():
        (proc / pid).mkdir(parents=True)
        (proc / pid / "cgroup").write_text(f"0::{path}\n")
    (cgroup / "kubepods/pod1/c1").mkdir(parents=True)
    (cgroup / "kubepods/pod1/c1/memory.max").write_text("max\n")
    (cgroup / "kubepods/pod1/memory.max").write_text(f"{8 * GiB}\n")
    (cgroup / "kubepods/pod1/memory.current").write_text(f"{6 * GiB}\n")
    (cgroup / "kubepods/memory.max").write_text(f"{64 * GiB}\n")
    (cgroup / "kubepods/memory.current").write_text(f"{10 * GiB}\n")
    (cgroup / "free").mkdir()
    (cgroup / "free/memory.max").write_text("max\n")
    return proc, cgroup


def test_the_tightest_limit_on_a_cgroups_path_is_its_headroom(tmp_path: Path) -> None:
    proc, cgroup = _tree(tmp_path)
    found = cgroup_headrooms([10, 11, 12, 99], proc=proc, sys_fs_cgroup=cgroup)
    assert found == [CgroupHeadroom("/kubepods/pod1", 8 * GiB, 6 * GiB)]
    assert found[0].free == 2 * GiB
