"""The operator's thin adapter to the scheduler: PutGroup, GetGroup, DeleteGroup over grpc.

Answers become plain `SchedulerView` values for the pure reconcile functions; failures
become rlslice errors (`NotFoundError` is folded into None/False where absence is normal).
"""

from __future__ import annotations

import grpc

from rlslice._errors import NotFoundError
from rlslice.adapters.channel import open_channel
from rlslice.adapters.grpc_errors import error_from_rpc
from rlslice.adapters.wire import group_spec_from_proto, group_spec_to_proto
from rlslice.config import GroupSpec, TLSConfig
from rlslice.operator.reconcile import SchedulerView
from rlslice.v1alpha1 import scheduler_pb2, scheduler_pb2_grpc


def view_from_proto(status: scheduler_pb2.GroupStatus) -> SchedulerView:
    """A GroupStatus answer as a plain value."""
    return SchedulerView(
        spec=group_spec_from_proto(status.spec),
        phase=status.phase or "Idle",
        holder=status.holder,
        queue=tuple(status.queue),
        resident=tuple(status.resident),
        parked=tuple(status.parked),
        nodes=tuple(status.nodes),
        epoch=status.epoch,
        switches=status.switches,
        busy_fraction=status.busy_fraction,
        last_switch_seconds=status.last_switch_seconds,
    )


class SchedulerAPI:
    """Scheduler calls the operator makes, each with a deadline."""

    def __init__(
        self,
        address: str,
        *,
        tls: TLSConfig | None = None,
        token: str | None = None,
        timeout: float = 10.0,
    ) -> None:
        self._channel = open_channel(address, tls=tls, token=token)
        # The generated stubs type the asyncio flavour as SchedulerAsyncStub.
        self._stub: scheduler_pb2_grpc.SchedulerAsyncStub = scheduler_pb2_grpc.SchedulerStub(  # type: ignore[assignment]
            self._channel
        )
        self._timeout = timeout

    async def get(self, name: str) -> SchedulerView | None:
        """The group's state, or None when the scheduler does not have it."""
        try:
            status = await self._stub.GetGroup(
                scheduler_pb2.GetGroupRequest(group=name), timeout=self._timeout
            )
        except grpc.RpcError as error:
            raised = error_from_rpc(error)
            if isinstance(raised, NotFoundError):
                return None
            raise raised from None
        return view_from_proto(status)

    async def put(self, spec: GroupSpec) -> SchedulerView:
        """Create or replace the group (idempotent); the scheduler's state after it."""
        try:
            status = await self._stub.PutGroup(
                scheduler_pb2.PutGroupRequest(spec=group_spec_to_proto(spec)), timeout=self._timeout
            )
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None
        return view_from_proto(status)

    async def delete(self, name: str, *, force: bool) -> bool:
        """Delete the group; False when it was already gone."""
        try:
            await self._stub.DeleteGroup(
                scheduler_pb2.DeleteGroupRequest(group=name, force=force), timeout=self._timeout
            )
        except grpc.RpcError as error:
            raised = error_from_rpc(error)
            if isinstance(raised, NotFoundError):
                return False
            raise raised from None
        return True

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close(None)
