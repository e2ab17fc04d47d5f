"""One `GroupHold` per group knows whether the job holds it and whether its lock was lost.

The leases run over a scripted channel (`scripted.py`). Cases:
- a grant makes the client hold the group under the lease's generation; giving it up ends that;
- registering the group again makes a hold granted before it lost, and one granted after not;
- the keep-alive's registration again reaches the subscribers of `Leases`;
- a disabled client's holds only count phases: never held, never lost.
"""

from __future__ import annotations

import asyncio

import grpc

from rlslice.client._holds import Holds
from rlslice.client._leases import Leases
from rlslice.client._lock_calls import LockCalls
from rlslice.client._results import Grant
from rlslice.client._settings import ClientSettings, resolve_settings
from rlslice.v1alpha1 import scheduler_pb2 as pb

from .scripted import Step, scripted_wire

GRANT = Grant(4, 0.0, False, 0.0, 0, "gpus", "a")


def _register(n: int, seconds: float = 3600.0) -> pb.RegisterResponse:
    return pb.RegisterResponse(lease_id=f"lease-{n}", secret=f"secret-{n}", lease_seconds=seconds)


def _settings() -> ClientSettings:
    return resolve_settings(
        job="a",
        group="gpus",
        scheduler="127.0.0.1:1",
        lease_seconds=None,
        token=None,
        tls=None,
        priority=None,
        weight=None,
        env={},
    )


def _parts(scripts: dict[str, list[Step]]) -> tuple[Leases, Holds]:
    wire, _ = scripted_wire(scripts)
    leases = Leases(wire, _settings(), None)
    holds = Holds("a", leases, LockCalls(wire, leases, "a"))
    leases.subscribe(holds.registered_again)
    return leases, holds


async def test_a_grant_is_held_until_given_up() -> None:
    leases, holds = _parts({"Register": [_register(1)], "Unregister": [pb.UnregisterResponse()]})
    lease = await leases.get("gpus", None)
    holds.granted("gpus", GRANT)
    hold = holds.of("gpus")
    assert holds.holds("gpus")
    assert (hold.grant, hold.generation) == (GRANT, lease.generation)
    holds.given_up("gpus")
    assert not holds.holds("gpus")
    assert hold.grant == GRANT  # the latest grant stays for what a lost lock reports
    await leases.close()


async def test_a_hold_granted_before_a_registration_again_is_lost() -> None:
    leases, holds = _parts(
        {
            "Register": [_register(1), _register(2)],
            "Unregister": [pb.UnregisterResponse()],
        }
    )
    lease = await leases.get("gpus", None)
    holds.granted("gpus", GRANT)
    assert not holds.lost(holds.of("gpus"))
    await leases.renew(lease, lease.generation, None)
    assert holds.lost(holds.of("gpus"))
    holds.granted("gpus", GRANT)  # a grant under the new lease
    assert not holds.lost(holds.of("gpus"))
    await leases.close()


async def test_the_keep_alive_tells_its_subscribers_it_registered_again() -> None:
    wire, _ = scripted_wire(
        {
            "Register": [_register(1, seconds=0.01), _register(2)],
            "KeepAlive": [grpc.StatusCode.NOT_FOUND],
            "Unregister": [pb.UnregisterResponse()],
        }
    )
    leases = Leases(wire, _settings(), None)
    heard: asyncio.Queue[str] = asyncio.Queue()
    leases.subscribe(heard.put_nowait)
    lease = await leases.get("gpus", None)
    assert await asyncio.wait_for(heard.get(), 10) == "gpus"
    assert lease.lease_id == "lease-2"
    await leases.close()


async def test_a_disabled_clients_holds_are_never_held_nor_lost() -> None:
    holds = Holds("", None, None)
    hold = holds.of("")
    hold.phases += 1
    assert not holds.holds("")
    assert not holds.lost(hold)
    holds.registered_again("")  # nothing to bring home
    assert not holds.coming_home("")
    await holds.close()
