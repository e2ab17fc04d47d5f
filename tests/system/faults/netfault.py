"""Real network faults on loopback for the fault tests: the soak's nftables helper
(`rlslice.apps.bench.soak.net`: one table per test, deleted pass or fail; a party cut off
by the group id of its sockets), plus random loss on one address. Every address stays in
127.0.0.0/8."""

from __future__ import annotations

import os

from rlslice.apps.bench.soak.net import Nft as _SoakNft
from rlslice.apps.bench.soak.net import _nft, fresh_gid, missing

__all__ = ["Nft", "fresh_gid", "missing", "private_host"]


class Nft(_SoakNft):
    """One test's nftables table on `lo` (deleted with every rule by `close()`)."""

    def lose(self, host: str, percent: int) -> list[int]:
        """Drop `percent` % of the packets on lo to and from `host` (an address of this
        test's alone, say a `DelayProxy`'s, so no other test's traffic is touched); the
        rules' handles (for `heal`)."""
        assert host.startswith("127.")
        assert 0 < percent < 100
        handles = []
        for way in ("daddr", "saddr"):
            out = _nft(
                "--echo", "--handle", "add", "rule", "inet", self.name, "out",
                "oifname", "lo", "ip", way, host, "numgen", "random", "mod", "100",
                "<", str(percent), "counter", "drop",
            )  # fmt: skip
            handles.append(int(out.rsplit("# handle", 1)[1].split()[0]))
        return handles

    def dropped(self) -> int:
        """Packets the `lose` rules have dropped so far."""
        words = self.rules().split()
        return sum(int(words[i + 1]) for i, w in enumerate(words[:-1]) if w == "packets")


def private_host(index: int = 1) -> str:
    """An address in 127.0.0.0/8 of this process's own (by pid), `index` 1-250: rules
    matching it touch no other test's connections."""
    assert 1 <= index <= 250
    pid = os.getpid()
    return f"127.{100 + (pid >> 8) % 150}.{pid % 256}.{index}"
