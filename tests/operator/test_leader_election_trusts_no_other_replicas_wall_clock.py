"""Leader election judges expiry on each replica's own monotonic clock, never by comparing
another replica's renewTime with local wall time (issue 25, defect 9).

- two electors whose wall clocks are skewed by more than the lease duration (either way)
  never lead at once, stepping injected clocks through renewals, a crash and a takeover
- a candidate that first sees a live lease waits the whole lease duration from then
- a leader that cannot renew steps down within the renew deadline, on its own clock
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rlslice.adapters.kube import KubeError
from rlslice.scheduler.leader import LeaseElector, Observation, expired, observe

PATH = "/apis/coordination.k8s.io/v1/namespaces/ns/leases/lease"


class FakeLeaseAPI:
    """One Lease with a resourceVersion, JSON-patch `test` operations honoured (CAS)."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.down = False

    async def request(
        self, method: str, path: str, body: Any = None, *, content_type: str = ""
    ) -> dict[str, Any]:
        if self.down:
            raise KubeError(0, "no answer")
        if method == "GET":
            if self.lease is None:
                raise KubeError(404, "not found")
            return {"metadata": {"resourceVersion": str(self.version)}, "spec": self.lease}
        if method == "POST":
            if self.lease is not None:
                raise KubeError(409, "exists")
            self.lease = dict(body["spec"])
        else:
            assert self.lease is not None
            for op in body:
                field = op["path"].removeprefix("/spec/")
                if op["op"] == "test" and self.lease.get(field) != op["value"]:
                    raise KubeError(422, "test failed")
            self.lease = dict(body[-1]["value"])
        self.version += 1
        return {}


class Replica:
    """An elector with its own wall clock (skewed) and its own monotonic clock."""

    def __init__(self, api: FakeLeaseAPI, name: str, skew: float, start: float) -> None:
        self.now = 0.0  # the shared true time, advanced by the test
        self.elector = LeaseElector(
            api,  # type: ignore[arg-type]
            "ns",
            "lease",
            name,
            duration=15.0,
            clock=lambda: 1_700_000_000.0 + self.now + skew,
            monotonic=lambda: start + self.now,
        )


def observation_rule() -> None:
    first = observe(None, ("b", "t1", "7"), 10.0)
    assert observe(first, ("b", "t1", "7"), 20.0) is first
    assert observe(first, ("b", "t2", "8"), 20.0) == Observation(("b", "t2", "8"), 20.0)
    assert not expired(first, 24.9, 15.0)
    assert expired(first, 25.0, 15.0)
    assert not expired(None, 1e9, 15.0)


def test_a_lease_lapses_only_after_being_seen_unchanged_for_its_duration() -> None:
    observation_rule()


@pytest.mark.parametrize("skew", [100.0, -100.0, 16.0, -16.0])
def test_two_electors_skewed_by_more_than_the_lease_never_lead_at_once(skew: float) -> None:
    api = FakeLeaseAPI()
    a = Replica(api, "a", 0.0, start=5_000.0)
    b = Replica(api, "b", skew, start=77.0)

    async def run() -> None:
        leaders_seen: set[str] = set()
        t = 0.0
        while t < 120.0:
            for replica in (a, b):
                replica.now = t
            if t < 60.0:  # a crashes at t=60: it renews no more
                await a.elector.step()
            await b.elector.step()
            leading = [n for n, r in (("a", a), ("b", b)) if r.elector.leading]
            assert len(leading) <= 1, (t, leading, api.lease)
            leaders_seen.update(leading)
            if 0 < t < 60.0:
                assert leading == ["a"], (t, api.lease)  # b never takes a live lease
            t += 0.5
        assert leaders_seen == {"a", "b"}  # b took over after a crashed
        assert b.elector.leading

    asyncio.run(run())


def test_a_candidate_that_first_sees_a_live_lease_waits_its_whole_duration() -> None:
    api = FakeLeaseAPI()
    a = Replica(api, "a", 0.0, start=0.0)
    b = Replica(api, "b", -1_000.0, start=0.0)  # b's wall clock says a's renewal is ancient

    async def run() -> None:
        await a.elector.step()  # a leads; then a is gone
        for t in (0.0, 5.0, 14.5):
            b.now = t
            await b.elector.step()
            assert not b.elector.leading, t
        b.now = 15.0
        assert await b.elector.step()

    asyncio.run(run())


def test_a_leader_that_cannot_renew_steps_down_within_the_renew_deadline() -> None:
    api = FakeLeaseAPI()
    a = Replica(api, "a", 0.0, start=0.0)

    async def run() -> None:
        assert await a.elector.step()
        api.down = True
        a.now = 9.9
        await a.elector.step()
        assert a.elector.leading  # still inside the renew deadline
        a.now = 10.0  # 2/3 of 15 s after the last renewal, on a's own clock
        assert not await a.elector.step()
        assert not a.elector.leading

    asyncio.run(run())
