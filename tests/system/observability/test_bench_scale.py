"""`rlslice bench scale`: the pure figures, and a short real run (scheduler in a subprocess).

Case matrix:

| part | checked |
|---|---|
| `percentile` | nearest-rank table, empty input |
| `plan` | every configuration offers the same acquires per second; groups are wanted `DEMAND` of the time |
| `parse_groups` | lists; bad text and counts below 1 refused naming `--groups` |
| `summarise` | overhead and immediate share from samples; RSS per event and the full-ring projection |
| `best_round` | the lowest p99 round, every round's p99 kept, the highest peak RSS |
| `verdict` | p99 ratio of the largest count over the first; RSS target |
| a real run (2 and 4 groups, 1.5 s) | one result per count, acquires and yields measured, no errors, CPU and RSS read from the scheduler's process, events kept, stall figures present |
| bad flags | exit 2 with one line naming the flag |
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlslice.apps.bench._scale_figures import (
    DEMAND,
    P99_RATIO_TARGET,
    RSS_TARGET_MIB,
    Result,
    Samples,
    best_round,
    parse_groups,
    percentile,
    plan,
    summarise,
    verdict,
)
from rlslice.apps.cli import main

MiB = 2**20


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([], 99, 0.0),
        ([5.0], 50, 5.0),
        ([1.0, 2.0, 3.0, 4.0], 50, 2.0),
        ([1.0, 2.0, 3.0, 4.0], 99, 4.0),
        ([float(n) for n in range(1, 101)], 99, 99.0),
        ([float(n) for n in range(1, 101)], 100, 100.0),
        ([3.0, 1.0, 2.0], 0, 1.0),
    ],
)
def test_percentiles_are_nearest_rank(values: list[float], q: float, expected: float) -> None:
    assert percentile(values, q) == expected


@given(st.integers(1, 5000), st.integers(1, 16), st.floats(1, 5000))
def test_every_configuration_offers_the_same_load(groups: int, jobs: int, rate: float) -> None:
    phases = plan(groups, jobs, rate)
    assert groups * jobs / phases.cycle == pytest.approx(rate)
    assert jobs * phases.hold / phases.cycle == pytest.approx(DEMAND)
    assert phases.cpu > 0


@pytest.mark.parametrize(
    ("text", "expected"), [("10,1000", [10, 1000]), ("7", [7]), (" 1, 2 ,", [1, 2])]
)
def test_group_counts_are_parsed(text: str, expected: list[int]) -> None:
    assert parse_groups(text) == expected


@pytest.mark.parametrize(
    ("text", "fragment"), [("ten", "comma-separated"), ("10,0", "1 or more"), ("", "1 or more")]
)
def test_bad_group_counts_are_refused_naming_the_flag(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=f"--groups: .*{fragment}"):
        parse_groups(text)


def result(groups: int, p99: float, peak: float = 50.0) -> Result:
    figures = summarise(
        groups,
        8,
        10.0,
        Samples(overhead=[0.001] * 98 + [p99 / 1000] * 2),
        register_seconds=0.0,
        cpu_seconds=1.0,
        rss_idle=40 * MiB,
        rss=50 * MiB,
        peak_rss=int(peak * MiB),
    )
    return figures


def test_summarise_turns_samples_into_figures() -> None:
    samples = Samples(
        overhead=[0.001, 0.002, 0.003, 0.004],
        immediate=[0.001],
        yields=[0.001, 0.001],
        waited=[0.0, 0.5, 0.5, 0.5],
    )
    figures = summarise(
        10,
        8,
        5.0,
        samples,
        register_seconds=1.5,
        cpu_seconds=0.6,
        rss_idle=50 * MiB,
        rss=60 * MiB,
        peak_rss=61 * MiB,
        events=(100, 1100, 5100),
    )
    assert (figures.acquires, figures.yields) == (4, 2)
    assert figures.overhead_p50_ms == pytest.approx(2.0)
    assert figures.overhead_p99_ms == pytest.approx(4.0)
    assert figures.immediate_share == 0.25
    assert figures.wait_p50_ms == pytest.approx(500.0)
    assert figures.scheduler_cpu_us_per_call == pytest.approx(0.6 / 6 * 1e6)
    assert figures.rss_bytes_per_event == pytest.approx(10 * MiB / 1000)
    assert figures.projected_full_ring_rss_mib == pytest.approx(60 + 4000 * 10 / 1000)
    assert figures.scheduler_peak_rss_mib == 61


def test_the_best_round_is_the_lowest_p99_with_every_rounds_p99_and_the_highest_rss() -> None:
    rounds = [result(10, 30.0, peak=60), result(10, 12.0, peak=55), result(10, 20.0, peak=58)]
    best = best_round(rounds)
    assert best.overhead_p99_ms == pytest.approx(12.0)
    assert best.overhead_p99_rounds_ms == pytest.approx((30.0, 12.0, 20.0))
    assert best.scheduler_peak_rss_mib == 60


@pytest.mark.parametrize(
    ("base_p99", "top_p99", "peak", "ratio_met", "rss_met"),
    [
        (10.0, 19.0, 150.0, True, True),
        (10.0, 21.0, 150.0, False, True),
        (10.0, 10.0, RSS_TARGET_MIB + 1, True, False),
    ],
)
def test_the_verdict_compares_the_largest_count_with_the_first(
    base_p99: float, top_p99: float, peak: float, ratio_met: bool, rss_met: bool
) -> None:
    figures = verdict([result(10, base_p99), result(1000, top_p99, peak=peak)])
    assert figures["p99_overhead_ratio"] == pytest.approx(top_p99 / base_p99)
    assert figures["p99_overhead_ratio_target"] == P99_RATIO_TARGET
    assert figures["p99_overhead_ratio_met"] is ratio_met
    assert figures["rss_met"] is rss_met


def test_a_zero_baseline_gives_no_ratio_rather_than_a_division_error() -> None:
    base = replace(result(10, 1.0), overhead_p99_ms=0.0)
    assert verdict([base, result(1000, 5.0)])["p99_overhead_ratio"] == 0.0


@pytest.mark.slow
def test_a_short_real_run_measures_both_counts(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "bench", "scale", "--json", "--groups", "2,4", "--jobs", "2",
            "--seconds", "1.5", "--rate", "40", "--rounds", "1",
        ]
    )  # fmt: skip
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["groups"] for r in report["results"]] == [2, 4]
    for figures in report["results"]:
        assert figures["acquires"] > 5
        assert figures["yields"] > 5
        assert figures["errors"] == 0
        assert 0 < figures["overhead_p50_ms"] <= figures["overhead_p99_ms"]
        assert figures["scheduler_cpu_seconds"] > 0
        assert 10 < figures["scheduler_rss_mib"] < 1000
        assert figures["scheduler_peak_rss_mib"] >= figures["scheduler_rss_mib"]
        assert (
            figures["events_kept"] > figures["groups"] * figures["jobs"]
        )  # registrations and more
        assert figures["loop_lag_max_ms"] > 0
        assert figures["gc_tracked_objects"] > 0
    assert report["machine"]["cpus"] >= 1
    assert set(report["targets"]) >= {"p99_overhead_ratio", "rss_met"}


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--groups", "x"], "--groups"),
        (["--jobs", "0"], "--jobs"),
        (["--rounds", "0"], "--rounds"),
        (["--seconds", "0"], "--seconds"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(
    flags: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "scale", *flags]) == 2
    err = capsys.readouterr().err
    assert fragment in err
    assert len(err.strip().splitlines()) == 1
