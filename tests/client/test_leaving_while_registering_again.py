"""A job that leaves while its keep-alive registers it again unregisters that new lease.

After a partition the scheduler lapsed the job's lease; the keep-alive finds it unknown
and registers again. If the job leaves (closes its client) while that Register is in
flight, the Register must not be lost with the cancelled keep-alive: its lease is the one
the job unregisters (which releases its state with force, so a fenced job's processes
are resumed). Registering once more instead would be refused ALREADY_EXISTS, and the
state would stay parked, its processes frozen (what the fencing fault test caught).

A scripted stub stands in for the scheduler; its second Register is answered only once
the keep-alive has been cancelled, the order that lost the lease before.
"""

from __future__ import annotations

import asyncio

import grpc
from google.protobuf.message import Message

from rlslice.client._leases import Leases
from rlslice.v1alpha1 import scheduler_pb2 as pb

from .scripted import Answer
from .scripted import scripted_wire as _wire


async def test_a_client_closed_while_its_keep_alive_registers_again_unregisters_that_lease() -> (
    None
):
    registering_again, keep_alive_stopped = asyncio.Event(), asyncio.Event()

    async def registered_once_the_keep_alive_stopped(_: Message) -> Answer:
        registering_again.set()
        await keep_alive_stopped.wait()
        return pb.RegisterResponse(lease_id="lease-2", secret="secret-2", lease_seconds=30)

    wire, stub = _wire(
        {
            "Register": [
                pb.RegisterResponse(lease_id="lease-1", secret="secret-1", lease_seconds=0.15),
                registered_once_the_keep_alive_stopped,
                grpc.StatusCode.ALREADY_EXISTS,  # what a third Register would meet
            ],
            "KeepAlive": [grpc.StatusCode.NOT_FOUND],  # lapsed during a partition
            "Unregister": [grpc.StatusCode.NOT_FOUND, pb.UnregisterResponse()],
        }
    )
    leases = Leases(wire, wire._settings, None)
    lease = await leases.get("gpus", None)
    assert lease.task is not None
    lease.task.add_done_callback(lambda _: keep_alive_stopped.set())
    await registering_again.wait()
    await leases.close()
    unregistered = [r.lease_id for m, r in stub.requests if m == "Unregister"]  # type: ignore[attr-defined]
    assert unregistered == ["lease-1", "lease-2"]
    assert stub.asked.count("Register") == 2
