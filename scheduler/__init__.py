"""The rlslice scheduler: one lock queue per group of GPUs, leases, switches over agents.

    from rlslice.scheduler import SchedulerSettings, start_scheduler

    scheduler = await start_scheduler(SchedulerSettings(address="127.0.0.1:0"))
    ...
    await scheduler.stop()

The pure state machine is in `rlslice.scheduler.core`; stores in `rlslice.scheduler.store`.
Names are imported on first use, so the pure core loads without grpc; starting a scheduler
needs the `scheduler` extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlslice.scheduler.server import RunningScheduler, start_scheduler
    from rlslice.scheduler.settings import SchedulerSettings

__all__ = ["RunningScheduler", "SchedulerSettings", "start_scheduler"]


def __getattr__(name: str) -> object:
    if name in ("RunningScheduler", "start_scheduler"):
        from rlslice.scheduler import server

        return getattr(server, name)
    if name == "SchedulerSettings":
        from rlslice.scheduler import settings

        return settings.SchedulerSettings
    raise AttributeError(f"module 'rlslice.scheduler' has no attribute {name!r}")
