"""Backends move device state; they are found through the `rlslice.backends` entry points."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import entry_points

from rlslice.config import BACKEND_ENTRY_POINTS
from rlslice.snapshot_agent.backends.base import Backend

ENTRY_POINT_GROUP = BACKEND_ENTRY_POINTS  # one name for the group (rlslice.config)


@dataclass(frozen=True)
class BackendEntry:
    """One installed backend: its class, or why it could not be loaded."""

    name: str
    cls: type[Backend] | None
    error: str = ""


def installed_backends() -> dict[str, BackendEntry]:
    """Every backend of the entry-point group, loaded; import failures are reported, not raised."""
    found: dict[str, BackendEntry] = {}
    for point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            cls = point.load()
        except Exception as error:  # an optional dependency missing, say
            found[point.name] = BackendEntry(point.name, None, f"{type(error).__name__}: {error}")
            continue
        found[point.name] = BackendEntry(point.name, cls)
    return dict(sorted(found.items()))
