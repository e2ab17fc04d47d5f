"""A short soak (`rlslice bench soak` in miniature) runs in CI.

Two groups of three jobs on two agent processes and a scheduler process, for about half
a minute, with a fault every ~2.5 s: the first three are a job, an agent and the
scheduler killed with SIGKILL (each comes back), then random ones. The event log must
show no violation: never two holders, every acquire answered, bytes intact after every
restore, epochs rising, every job stopped; and everything drains to nothing afterwards.
The 10-minute run with 10 groups of 5 jobs is `rlslice bench soak --minutes 10`
(figures in docs/reliability.md); `RLSLICE_SOAK_MINUTES=N` runs it here as a slow test.
"""

from __future__ import annotations

import os

import pytest

from rlslice.apps.bench.soak import SoakConfig, soak


async def test_a_short_soak_with_kills_and_restarts_keeps_every_invariant() -> None:
    report = await soak(SoakConfig(seconds=25, groups=2, jobs=3, seed=7, fault_interval=2.5))
    assert report["violation_details"] == []
    assert report["violations"] == 0
    assert report["switches"] > 10
    assert report["hash_checks"] > 10
    assert set(report["kills"]) == {"job", "agent", "scheduler"}
    assert report["restarts"] == report["kills"]


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("RLSLICE_SOAK_MINUTES"), reason="set RLSLICE_SOAK_MINUTES to run"
)
@pytest.mark.timeout(0)
async def test_a_long_soak_keeps_every_invariant() -> None:
    minutes = float(os.environ["RLSLICE_SOAK_MINUTES"])
    report = await soak(SoakConfig(seconds=minutes * 60, groups=10, jobs=5, seed=1))
    assert report["violation_details"] == []
    assert report["violations"] == 0
