"""Real network faults on loopback for the fault tests: the soak's nftables helper
(`rlslice.apps.bench._soak_net`: one table per test, deleted pass or fail; a party cut off
by the group id of its sockets). Every address stays in 127.0.0.0/8."""

from __future__ import annotations

from rlslice.apps.bench._soak_net import Nft, fresh_gid, missing

__all__ = ["Nft", "fresh_gid", "missing"]
