"""Register is bounded, so one job-token holder cannot grow the scheduler past what its
store can hold (a live scheduler on loopback):

- a group with `max_jobs_per_group` jobs refuses one more RESOURCE_EXHAUSTED, the message
  naming the group and the limit; a job of that group registering again, and a job of
  another group, are not refused; once a job leaves, the next Register is accepted;
- with `auto_create_groups`, a scheduler with `max_groups` groups refuses to create one more
  RESOURCE_EXHAUSTED, naming the group and the limit; existing groups still take jobs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest

from rlslice.v1alpha1 import scheduler_pb2 as pb

pytestmark = pytest.mark.timeout(30)


async def test_a_full_group_refuses_one_more_job_naming_the_group_and_the_limit(
    start_live: Callable[..., Any],
) -> None:
    async with start_live(max_jobs_per_group=2) as live:
        a = await live.register("a")
        await live.register("b")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await live.register("c")
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        message = caught.value.details() or ""
        assert "'g'" in message
        assert "--max-jobs-per-group 2" in message
        assert "\n" not in message
        assert set(live.engine.groups["g"].state.jobs) == {"a", "b"}
        await live.register("c", group="other")  # another group has room
        await live.stub.Unregister(pb.UnregisterRequest(lease_id=a.lease_id, secret=a.secret))
        await live.register("c")  # room again


async def test_auto_create_beyond_the_group_limit_is_refused_naming_the_group_and_the_limit(
    start_live: Callable[..., Any],
) -> None:
    async with start_live(max_groups=2) as live:
        await live.register("a", group="g1")
        await live.register("a", group="g2")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await live.register("a", group="g3")
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        message = caught.value.details() or ""
        assert "'g3'" in message
        assert "--max-groups 2" in message
        assert "g3" not in live.engine.groups
        await live.register("b", group="g1")  # an existing group still takes jobs
