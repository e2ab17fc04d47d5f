"""A real scheduler, in-process on loopback, for your own tests.

See `rlslice.testing.scheduler_for_tests` (async) and `SchedulerForTests` (sync). It is the
scheduler `rlslice scheduler` runs, not a fake, and it needs the `scheduler` extra.
"""

from rlslice.testing._scheduler import SchedulerForTests, TestScheduler, scheduler_for_tests

__all__ = ["SchedulerForTests", "TestScheduler", "scheduler_for_tests"]
