"""Timelines as plain data, and a PNG of them (one lane per job, switches marked).

The simulator, `rlslice simulate`, the demo and `rlslice timeline` all draw through
`plot_timeline`; it takes plain tuples so that measured timelines (from a scheduler's
events) and simulated ones look the same. matplotlib is imported only when drawing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from rlslice._errors import InvalidArgumentError


class TimelineInterval(NamedTuple):
    """`job` did `kind` from `start` to `end` (seconds).

    Kinds are `gpu`, `cpu`, `wait` or `switch`, optionally with a phase after a colon
    (`gpu:rollout`); the part before the colon picks the colour.
    """

    job: str
    start: float
    end: float
    kind: str


@dataclass(frozen=True)
class SwitchMarker:
    """A switch of the group: state moved between device and host from `start` to `end`."""

    start: float
    end: float
    incoming: str = ""
    outgoing: tuple[str, ...] = ()
    moved_bytes: int = 0


#: colour of each kind of interval (the part of `kind` before a colon)
KIND_COLOURS: dict[str, str] = {
    "gpu": "#2ca02c",
    "cpu": "#1f77b4",
    "wait": "#d9d9d9",
    "switch": "#d62728",
}
_EXTRA_COLOURS = ("#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf", "#ff7f0e")


def _intervals(lanes: Iterable[TimelineInterval | Sequence[object]]) -> list[TimelineInterval]:
    out = []
    for index, item in enumerate(lanes):
        if len(item) != 4:
            raise InvalidArgumentError(f"lanes[{index}] must be (job, start, end, kind)")
        job, start, end, kind = item
        if not isinstance(job, str) or not isinstance(kind, str):
            raise InvalidArgumentError(f"lanes[{index}] job and kind must be strings")
        if isinstance(start, bool) or isinstance(end, bool):
            raise InvalidArgumentError(f"lanes[{index}] start and end must be numbers")
        if not isinstance(start, int | float) or not isinstance(end, int | float) or end < start:
            raise InvalidArgumentError(f"lanes[{index}] must have numeric start <= end")
        out.append(TimelineInterval(job, float(start), float(end), kind))
    return out


def _markers(switches: Iterable[SwitchMarker | Sequence[float]]) -> list[tuple[float, float]]:
    out = []
    for index, item in enumerate(switches):
        if isinstance(item, SwitchMarker):
            out.append((item.start, item.end))
        elif len(item) == 2:
            out.append((float(item[0]), float(item[1])))
        else:
            raise InvalidArgumentError(f"switches[{index}] must be a SwitchMarker or (start, end)")
    return out


def plot_timeline(
    lanes: Iterable[TimelineInterval | Sequence[object]],
    path: str | Path,
    *,
    switches: Iterable[SwitchMarker | Sequence[float]] = (),
    title: str = "",
) -> Path:
    """Draw one lane per job (in order of first appearance) and a `switches` lane; save a PNG.

    Returns the path written. Uses matplotlib's Agg backend without touching global state.
    """
    intervals = _intervals(lanes)
    marks = _markers(switches)
    from matplotlib.figure import Figure

    jobs = list(dict.fromkeys(interval.job for interval in intervals))
    colours = _colours(intervals)
    rows = len(jobs) + 1
    figure = Figure(figsize=(11, 1.0 + 0.6 * rows))
    axes = figure.add_subplot()
    _draw_lanes(axes, jobs, intervals, marks, colours)
    axes.set_yticks(range(rows), [*jobs, "switches"])
    axes.set_ylim(rows - 0.5, -0.5)
    axes.set_xlabel("time, s")
    if title:
        axes.set_title(title)
    axes.grid(axis="x", alpha=0.25)
    _legend(axes, intervals, marks, colours)
    figure.tight_layout()
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(target, dpi=110, bbox_inches="tight")
    return target


def _colours(intervals: Sequence[TimelineInterval]) -> dict[str, str]:
    """The fixed colour of each known kind; an unknown kind takes the next spare colour."""
    colours = dict(KIND_COLOURS)
    for interval in intervals:
        base = interval.kind.split(":", 1)[0]
        if base not in colours:
            colours[base] = _EXTRA_COLOURS[(len(colours) - len(KIND_COLOURS)) % len(_EXTRA_COLOURS)]
    return colours


def _draw_lanes(
    axes: Any,
    jobs: Sequence[str],
    intervals: Sequence[TimelineInterval],
    marks: Sequence[tuple[float, float]],
    colours: Mapping[str, str],
) -> None:
    """One bar row per job, then the switches row with a faint line at each switch's start."""
    for row, job in enumerate(jobs):
        for interval in intervals:
            if interval.job == job:
                base = interval.kind.split(":", 1)[0]
                axes.broken_barh(
                    [(interval.start, interval.end - interval.start)],
                    (row - 0.4, 0.8),
                    facecolors=colours[base],
                    edgecolor="none",
                )
    switch_row = len(jobs)
    if marks:
        axes.broken_barh(
            [(start, max(end - start, 1e-9)) for start, end in marks],
            (switch_row - 0.4, 0.8),
            facecolors=KIND_COLOURS["switch"],
        )
        for start, _ in marks:
            axes.axvline(start, color=KIND_COLOURS["switch"], linewidth=0.4, alpha=0.35)


def _legend(
    axes: Any,
    intervals: Sequence[TimelineInterval],
    marks: Sequence[tuple[float, float]],
    colours: Mapping[str, str],
) -> None:
    from matplotlib.patches import Patch

    used = sorted({i.kind.split(":", 1)[0] for i in intervals} | ({"switch"} if marks else set()))
    axes.legend(
        handles=[Patch(color=colours[kind], label=kind) for kind in used],
        loc="upper left",
        bbox_to_anchor=(1.005, 1.0),
        fontsize="small",
        frameon=False,
    )
