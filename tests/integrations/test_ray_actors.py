"""`@gpu_phase` on real Ray actors: a local Ray cluster, two jobs' actors, one group.

Cases:
- plain methods of two jobs' actors (separate processes, each configured only through
  `runtime_env`) hold the group for each call: the calls never overlap, and during each
  call the scheduler names the calling job as the holder;
- the same with `async def` methods (Ray runs those actors on an event loop, so one job's
  calls overlap each other, sharing one hold; never another job's).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from rlslice.testing import SchedulerForTests

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def _holder_now() -> str:
    """The holder of this actor's group, as the scheduler reports it now."""
    import grpc

    from rlslice.v1alpha1 import scheduler_pb2, scheduler_pb2_grpc

    with grpc.insecure_channel(os.environ["RLSLICE_SCHEDULER"]) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        request = scheduler_pb2.GetGroupRequest(group=os.environ["RLSLICE_GROUP"])
        return str(stub.GetGroup(request, timeout=10).holder)


def _env(sched: SchedulerForTests, job: str) -> dict[str, Any]:
    return {
        "env_vars": {
            "RLSLICE_SCHEDULER": sched.address,
            "RLSLICE_JOB": job,
            "RLSLICE_GROUP": "gpus",
            "PYTHONSAFEPATH": "1",
        }
    }


def _check_turns(spans: list[tuple[float, float, str, str]]) -> None:
    # Calls of one job may overlap (an async actor runs them concurrently: one shared
    # hold); calls of two jobs never do.
    for start, end, _, job in spans:
        for other_start, other_end, _, other in spans:
            if other != job:
                assert end <= other_start or other_end <= start, f"{job} and {other} overlap"
    assert all(holder == job for _, _, holder, job in spans), spans
    assert {job for *_, job in spans} == {"a", "b"}


def test_plain_actor_methods_of_two_jobs_take_turns(cluster: None) -> None:
    from rlslice.integrations.ray import gpu_phase

    @ray.remote
    class Rollout:
        @gpu_phase("rollout")
        def generate(self, seconds: float) -> tuple[float, float, str, str]:
            import time

            start = time.time()
            holder = _holder_now()
            time.sleep(seconds)
            return start, time.time(), holder, os.environ["RLSLICE_JOB"]

    with SchedulerForTests(groups=["gpus"]) as sched:
        actors = [Rollout.options(runtime_env=_env(sched, job)).remote() for job in "ab"]
        spans = ray.get([actor.generate.remote(0.1) for _ in range(4) for actor in actors])
        _check_turns(spans)
        for actor in actors:
            ray.kill(actor)


def test_async_actor_methods_of_two_jobs_take_turns(cluster: None) -> None:
    from rlslice.integrations.ray import gpu_phase

    @ray.remote
    class Trainer:
        @gpu_phase("train")
        async def step(self, seconds: float) -> tuple[float, float, str, str]:
            import asyncio
            import time

            start = time.time()
            holder = await asyncio.to_thread(_holder_now)
            await asyncio.sleep(seconds)
            return start, time.time(), holder, os.environ["RLSLICE_JOB"]

    with SchedulerForTests(groups=["gpus"]) as sched:
        actors = [Trainer.options(runtime_env=_env(sched, job)).remote() for job in "ab"]
        spans = ray.get([actor.step.remote(0.1) for _ in range(4) for actor in actors])
        _check_turns(spans)
        for actor in actors:
            ray.kill(actor)
