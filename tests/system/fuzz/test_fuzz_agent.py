"""Hypothesis-generated requests against a live agent over gRPC, with a real job process.

Snapshot, Restore, Release, Status and Probe get random ids (unicode, empty, long),
epochs from the whole int64 range, backend names, backend options with junk values,
long lists of discard tags, mixed with the real job and group so that calls reach the
moves. For every request: a proper status code (never UNKNOWN, INTERNAL, UNIMPLEMENTED),
a one-line message, no job record changed by a refusal (ABORTED, a move the backend tried
and rolled back, marks the job FAULTED by design), and the agent still SERVING.
A malformed backend option (found this way) is INVALID_ARGUMENT and leaves the job as it
was, where it used to leave it FAULTED.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlslice.v1alpha1 import agent_pb2 as apb
from rlslice.v1alpha1 import agent_pb2_grpc

from .conftest import BROKEN, LiveAgent, serving

FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

texts = st.one_of(
    st.text(max_size=80),
    st.sampled_from(["", "a", "g", "A", "a" * 64, "a" * 50_000, "ä", "sim", "cuda", "app"]),
)
ids = st.one_of(st.sampled_from(["a", "g", "b"]), texts)
# Mostly the real job and group, so that calls reach the moves, not only the id checks.
jobs = st.one_of(st.just("a"), st.just("a"), ids)
groups = st.one_of(st.just("g"), st.just("g"), ids)
epochs = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1), st.integers(min_value=-2, max_value=50)
)
option_values = st.one_of(texts, st.sampled_from(["nan", "inf", "-1", "1e309", "0", "0.5"]))
options = st.dictionaries(
    st.one_of(st.sampled_from(["rate_gbps", "overhead_seconds", "root", "devices"]), texts),
    option_values,
    max_size=4,
)
backends = st.one_of(st.sampled_from(["", "sim"]), texts)

requests = st.one_of(
    st.tuples(st.just("Snapshot"), st.builds(
        lambda j, g, e, b, o, d: apb.SnapshotRequest(job=j, group=g, epoch=e, backend=b, options=o, discard_tags=d),
        jobs, groups, epochs, backends, options, st.lists(texts, max_size=50),
    )),
    st.tuples(st.just("Restore"), st.builds(
        lambda j, g, e, b, o: apb.RestoreRequest(job=j, group=g, epoch=e, backend=b, options=o),
        jobs, groups, epochs, backends, options,
    )),
    st.tuples(st.just("Release"), st.builds(lambda j, g: apb.ReleaseRequest(job=j, group=g, force=False), ids, ids)),
    st.tuples(st.just("Status"), st.just(apb.AgentStatusRequest())),
    st.tuples(st.just("Probe"), st.just(apb.ProbeRequest())),
)  # fmt: skip


def test_a_malformed_backend_option_is_invalid_argument_and_leaves_the_job_as_it_was(
    live_agent: LiveAgent,
) -> None:
    # Runs before the fuzzing below, which may park the job or raise its epoch.
    stub = agent_pb2_grpc.AgentStub(live_agent.channel)
    before = live_agent.records()
    for key, value in [("rate_gbps", "abc"), ("overhead_seconds", "nan"), ("rate_gbps", "-1")]:
        request = apb.SnapshotRequest(job="a", group="g", epoch=2**40, options={key: value})
        with pytest.raises(grpc.RpcError) as caught:
            stub.Snapshot(request, timeout=10)
        error: Any = caught.value
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (error.details() or "").startswith(f"options: {key}:")
        assert live_agent.records() == before  # not FAULTED: nothing was done


def test_fuzzed_agent_requests_get_proper_codes_and_refusals_change_nothing(
    live_agent: LiveAgent,
) -> None:
    live = live_agent
    stub = agent_pb2_grpc.AgentStub(live.channel)

    @FUZZ
    @given(call=requests)
    def check(call: tuple[str, Any]) -> None:
        method, request = call
        before = live.records()
        try:
            getattr(stub, method)(request, timeout=10)
        except grpc.RpcError as error:
            code, details = error.code(), error.details() or ""
            assert code not in BROKEN, (method, code, details)
            assert "\n" not in details, details
            if code != grpc.StatusCode.ABORTED:
                # ABORTED is not a refusal: the backend tried and failed (the `app` backend
                # for a job with no workload stream, say); the snapshot was rolled back and
                # the job is marked FAULTED with the reason, as documented.
                assert live.records() == before, (method, code, details)

    check()
    assert serving(live.channel)
    assert "a" in live.records()  # the job is still known (never released while it lives)
