"""The testing kit: real `rlslice` services on loopback, for your own tests and ours.

- In-process: `scheduler_for_tests` (async) and `SchedulerForTests` (sync) run the scheduler
  `rlslice scheduler` runs, not a fake (`TestScheduler` is what they yield).
- As processes: `Cluster` (a scheduler and agents, killed and restarted at will), `Service`
  (one server process), `start_service`, `wait_serving`, `rlslice_argv`, `child_env` and
  `free_port`; the demo, the benches, the soak and the fault tests use these.

It needs the `scheduler` extra (and `agent` for `Cluster`).
"""

from rlslice.testing._cluster import AgentNode, Cluster
from rlslice.testing._processes import (
    Service,
    child_env,
    free_port,
    rlslice_argv,
    start_service,
    wait_serving,
)
from rlslice.testing._scheduler import SchedulerForTests, TestScheduler, scheduler_for_tests

__all__ = [
    "AgentNode",
    "Cluster",
    "SchedulerForTests",
    "Service",
    "TestScheduler",
    "child_env",
    "free_port",
    "rlslice_argv",
    "scheduler_for_tests",
    "start_service",
    "wait_serving",
]
