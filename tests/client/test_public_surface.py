"""The public surface of `rlslice.client` is small and pinned; the root package re-exports it.

Cases: the exact names of `rlslice.client.__all__`; `rlslice.Client` and friends are the
same objects; `Grant` and `YieldResult` are frozen values; both clients offer the same calls.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest

import rlslice
import rlslice.client
from rlslice.client import AsyncClient, Client, Grant, YieldResult

EXPECTED = {
    "AsyncClient",
    "Client",
    "CommunicatorOffloader",
    "Grant",
    "RankedClient",
    "Ranks",
    "YieldResult",
    "communicator_path",
    "detect_ranks",
    "register_with_agent",
    "register_with_agent_async",
    "validate_phase",
}
CALLS = {"acquire", "yield_", "phase", "close", "yield_requested"}


def test_the_client_package_exports_exactly_the_pinned_names() -> None:
    assert set(rlslice.client.__all__) == EXPECTED


def test_the_root_package_re_exports_the_same_objects() -> None:
    assert rlslice.Client is Client
    assert rlslice.AsyncClient is AsyncClient
    assert rlslice.Grant is Grant


def test_results_are_frozen_values() -> None:
    grant = Grant(3, 0.5, True, 0.2, 1024, "g", "j")
    with pytest.raises(dataclasses.FrozenInstanceError):
        grant.epoch = 4  # type: ignore[misc]
    assert grant == Grant(3, 0.5, True, 0.2, 1024, "g", "j", disabled=False)
    assert [f.name for f in dataclasses.fields(YieldResult)] == [
        "waiters",
        "snapshot_deferred",
        "disabled",
    ]


@pytest.mark.parametrize("name", sorted(CALLS))
def test_both_clients_offer_each_call_with_the_same_parameters(name: str) -> None:
    sync_params = list(inspect.signature(getattr(Client, name)).parameters)
    async_params = list(inspect.signature(getattr(AsyncClient, name)).parameters)
    assert sync_params == async_params


def test_the_async_calls_are_coroutines_and_the_sync_ones_are_not() -> None:
    for name in ("acquire", "yield_", "close"):
        assert inspect.iscoroutinefunction(getattr(AsyncClient, name))
        assert not inspect.iscoroutinefunction(getattr(Client, name))
    assert list(inspect.signature(Client).parameters) == list(
        inspect.signature(AsyncClient).parameters
    )


def test_a_lost_lock_is_an_aborted_call_that_names_group_and_epoch() -> None:
    lost = rlslice.LockLostError("lost", group="g", job="j", epoch=7)
    assert isinstance(lost, rlslice.AbortedError)
    assert (lost.group, lost.job, lost.epoch) == ("g", "j", 7)
