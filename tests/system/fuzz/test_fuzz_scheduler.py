"""Hypothesis-generated requests against a live scheduler over gRPC.

Every field gets random text (unicode, empty, long), out-of-range and special numbers
(negative, huge, NaN, infinities), long repeated fields and maps, mixed with the real
values of a live lease so that calls get past the first check. For every request: the
answer is a proper status code (never UNKNOWN, INTERNAL, UNIMPLEMENTED), a refusal carries
a one-line message, a refused request changed no group's state, and the server still
answers health SERVING afterwards. A message over the 4 MiB limit is RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlslice.v1alpha1 import scheduler_pb2 as pb

from .conftest import BROKEN, LiveScheduler, serving

FUZZ = settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

texts = st.one_of(
    st.text(max_size=80),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-\n", min_size=1, max_size=70),
    st.sampled_from(["", "a", "g", "-a", "A", "a" * 64, "a" * 100_000, "ä", "g\n", "g\x00"]),
)
ids = st.one_of(st.sampled_from(["a", "g", "b", "h"]), texts)
floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -1.0, 0.05, 1e-300, 1e300, 3600.0, 3600.5]),
)
int32s = st.integers(min_value=-(2**31), max_value=2**31 - 1)
int64s = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def _leases(live: LiveScheduler) -> st.SearchStrategy[tuple[str, str]]:
    real = (live.lease.lease_id, live.lease.secret)
    return st.one_of(st.just(real), st.tuples(texts, texts), st.tuples(st.just(real[0]), texts))


def _requests(live: LiveScheduler) -> st.SearchStrategy[tuple[str, Any]]:
    leases = _leases(live)
    job_specs = st.builds(
        lambda name, priority, weight, backend: pb.JobSpec(
            name=name, priority=priority, weight=weight, backend=backend
        ),
        ids,
        int32s,
        floats,
        texts,
    )
    group_specs = st.builds(
        lambda name, policy, lease, hold, grace, backend, options, nodes, headroom, jobs: (
            pb.GroupSpec(
                name=name,
                policy=policy,
                lease_seconds=lease,
                max_hold_seconds=hold,
                yield_grace_seconds=grace,
                backend=backend,
                backend_options=options,
                nodes=nodes,
                headroom_bytes=headroom,
                jobs=jobs,
            )
        ),
        ids,
        st.integers(min_value=-5, max_value=10),
        floats,
        floats,
        floats,
        st.one_of(st.just("sim"), texts),
        st.dictionaries(texts, texts, max_size=5),
        st.lists(ids, max_size=40),
        int64s,
        st.lists(job_specs, max_size=20),
    )

    def register(job: str, group: str, lease: float, priority: int | None, weight: float | None, size: int) -> pb.RegisterRequest:  # fmt: skip
        request = pb.RegisterRequest(job=job, group=group, lease_seconds=lease, device_bytes=size)
        if priority is not None:
            request.priority = priority
        if weight is not None:
            request.weight = weight
        return request

    return st.one_of(
        st.tuples(st.just("Register"), st.builds(register, ids, ids, floats, st.none() | int32s, st.none() | floats, int64s)),
        st.tuples(st.just("KeepAlive"), leases.map(lambda c: pb.KeepAliveRequest(lease_id=c[0], secret=c[1]))),
        st.tuples(st.just("Acquire"), st.builds(lambda j, g, c, p: pb.AcquireRequest(job=j, group=g, lease_id=c[0], secret=c[1], phase=p), ids, ids, leases, texts)),
        st.tuples(st.just("Yield"), st.builds(lambda j, g, c: pb.YieldRequest(job=j, group=g, lease_id=c[0], secret=c[1]), ids, ids, leases)),
        st.tuples(st.just("GetGroup"), ids.map(lambda g: pb.GetGroupRequest(group=g))),
        st.tuples(st.just("GetEvents"), st.builds(lambda g, n: pb.GetEventsRequest(group=g, limit=n), ids, int32s)),
        st.tuples(st.just("PutGroup"), group_specs.map(lambda s: pb.PutGroupRequest(spec=s))),
        st.tuples(st.just("DeleteGroup"), st.builds(lambda g, f: pb.DeleteGroupRequest(group=g, force=f), ids, st.booleans())),
        st.tuples(st.just("RegisterAgent"), st.builds(
            lambda n, a, b, d, h, lab: pb.RegisterAgentRequest(node=n, address=a, backends=b, device_total_bytes=d, host_available_bytes=h, labels=lab),
            ids, st.one_of(st.just("127.0.0.1:1"), texts), st.lists(texts, max_size=30), st.lists(int64s, max_size=30), int64s, st.dictionaries(texts, texts, max_size=5),
        )),
        st.tuples(st.just("Unregister"), leases.map(lambda c: pb.UnregisterRequest(lease_id=c[0], secret=c[1]))),
    )  # fmt: skip


# Calls that would end the fixture's live lease or group are answered by a copy of the
# request with the real credentials replaced: the point is the answer's code.
_SPARE = {"Unregister", "DeleteGroup"}


def test_fuzzed_scheduler_requests_get_proper_codes_and_refusals_change_nothing(
    live_scheduler: LiveScheduler,
) -> None:
    live = live_scheduler

    @FUZZ
    @given(call=_requests(live))
    def check(call: tuple[str, Any]) -> None:
        method, request = call
        if method in _SPARE:
            if method == "Unregister" and request.lease_id == live.lease.lease_id:
                request.lease_id = "0"
            if method == "DeleteGroup" and request.group == "g":
                request.group = "h"
        before = live.states()
        try:
            getattr(live.stub, method)(request, timeout=0.5)
            code = grpc.StatusCode.OK
        except grpc.RpcError as error:
            code = error.code()
            details = error.details() or ""
            assert code not in BROKEN, (method, code, details)
            assert "\n" not in details, details
            if code != grpc.StatusCode.DEADLINE_EXCEEDED:
                assert live.states() == before, (method, code, details)
        assert code not in BROKEN

    check()
    assert serving(live.channel)
    assert "a" in live.states()["g"].jobs  # the live lease survived everything


def test_a_request_over_the_size_limit_is_resource_exhausted(
    live_scheduler: LiveScheduler,
) -> None:
    before = live_scheduler.states()
    huge = pb.RegisterRequest(job="a" * (5 << 20), group="g")
    with pytest.raises(grpc.RpcError) as caught:
        live_scheduler.stub.Register(huge, timeout=5)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
    assert live_scheduler.states() == before
    assert serving(live_scheduler.channel)
