"""The rlslice scheduler: one lock queue per group of GPUs, leases, switches over agents.

Public API: `SchedulerSettings`, `start_scheduler(settings) -> RunningScheduler`.
The pure state machine is in `rlslice.scheduler.core`; stores in `rlslice.scheduler.store`.
Importing this package pulls in grpc; install the `scheduler` extra.
"""

from rlslice.scheduler.server import RunningScheduler, start_scheduler
from rlslice.scheduler.settings import SchedulerSettings

__all__ = ["RunningScheduler", "SchedulerSettings", "start_scheduler"]
