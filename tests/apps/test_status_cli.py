"""`rlslice status` against a real scheduler: the table and `--json`, in a real process.

Cases:
- `--json`: 64-bit counters and sizes are JSON numbers (`"switches": 2`, not `"2"`), in
  the group, its spec and its jobs;
- the plain table (stdout a pipe): one header per value (switches and busy each under their
  own), a 63-character group name whole, the values the scheduler reports;
- the rich table at 80 columns: the group name whole, every header there.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from rlslice.apps import status as status_cli
from rlslice.client import Client
from rlslice.config import GroupSpec
from rlslice.testing import SchedulerForTests

LONG = "a-group-whose-name-is-sixty-three-characters-long-like-k8s-ones"
assert len(LONG) == 63


@pytest.fixture(scope="module")
def sched() -> Iterator[SchedulerForTests]:
    # Two jobs take turns: the group counts switches and raises its epoch.
    with (
        SchedulerForTests(groups=[GroupSpec(name=LONG, headroom_bytes=1 << 40)]) as running,
        Client(job="job-a", group=LONG, scheduler=running.address) as a,
        Client(job="job-b", group=LONG, scheduler=running.address) as b,
    ):
        for client in (a, b, a):
            with client.phase("train"):
                pass
        yield running


def cli(sched: SchedulerForTests, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLSLICE_")}
    done = subprocess.run(
        [sys.executable, "-m", "rlslice.apps", "status", "--scheduler", sched.address, *args],
        env=env | {"PYTHONSAFEPATH": "1"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_json_prints_64_bit_numbers_as_numbers(sched: SchedulerForTests) -> None:
    (group,) = json.loads(cli(sched, "--json"))
    truth = sched.group(LONG)
    assert truth.switches > 0
    assert group["switches"] == truth.switches
    assert group["epoch"] == truth.epoch
    assert isinstance(group["epoch"], int)
    assert group["spec"]["headroom_bytes"] == 1 << 40
    assert {job["job"] for job in group["jobs"]} == {"job-a", "job-b"}
    assert all(isinstance(job["lease_expires_at"], float) for job in group["jobs"])


def test_the_plain_table_has_one_header_per_value_and_whole_names(
    sched: SchedulerForTests,
) -> None:
    header, row, *rest = cli(sched).splitlines()
    assert rest == []
    starts = [header.index(name) for name in status_cli._COLUMNS]
    assert starts == sorted(starts)
    bounds = [*starts[1:], None]
    cells = {
        name: row[start:end].strip()
        for name, start, end in zip(status_cli._COLUMNS, starts, bounds, strict=True)
    }
    truth = sched.group(LONG)
    assert cells["group"] == LONG
    assert cells["epoch"] == str(truth.epoch)
    assert cells["switches"] == str(truth.switches)
    assert cells["busy"].endswith("%")
    assert cells["holder"] == "-"


def test_the_rich_table_keeps_group_names_whole_at_80_columns(sched: SchedulerForTests) -> None:
    pytest.importorskip("rich")
    from rich.console import Console

    out = io.StringIO()
    status_cli._table([sched.group(LONG)], Console(file=out, width=80))
    text = out.getvalue()
    assert LONG in text
    assert max(len(line) for line in text.splitlines()) <= 80
    for header in ("group", "switches", "busy", "epoch"):
        assert header in text
