"""What the client's calls return: plain frozen values, no grpc."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Grant:
    """The job holds the group: the answer to `acquire()`.

    A disabled client (no scheduler configured) returns a grant with `disabled=True`,
    `epoch=0` and zeros elsewhere: nothing was asked and nothing moved.
    """

    epoch: int
    """The group's epoch after this grant (raised at every grant; 0 when disabled)."""
    waited_seconds: float
    """Seconds the job waited in the group's queue."""
    restored: bool
    """Whether the job's device state was brought back from host memory for this grant."""
    switch_seconds: float
    """Seconds spent switching for this grant (snapshot of others, restore of this job)."""
    moved_bytes: int
    """Device bytes moved for this grant, out and in, over all nodes."""
    group: str
    """The group granted."""
    job: str
    """The job granted."""
    disabled: bool = False
    """True when no scheduler is configured and the client passed the call through."""
    discarded: tuple[str, ...] = ()
    """Tags of the job's `discard` parts (`JobSpec.parts`) a switch freed without a copy
    while it was parked: gone from the device, to be rebuilt before use. Empty when nothing
    was discarded (always so for a job that declared no `discard` part)."""


@dataclass(frozen=True)
class YieldResult:
    """The answer to `yield_()`: the group is given up."""

    waiters: int
    """Jobs waiting for the group after this yield."""
    snapshot_deferred: bool
    """No waiter: the job stays resident on the GPUs and nothing moved."""
    disabled: bool = False
    """True when no scheduler is configured and the client passed the call through."""
