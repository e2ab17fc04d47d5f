"""Real network faults on loopback for the soak and the fault tests: nftables rules.

Every rule lives in one nftables table per run (`inet rlslice_t<pid>_<n>`), deleted as a
whole when the run or test ends, pass or fail. Every address stays in 127.0.0.0/8.

A party is cut off by the group id of its sockets (`meta skgid`): the test starts it with
a group id of its own (root's uid, so it reads the interpreter under /root), and a rule
drops what its sockets send to a port. Dropping, not rejecting: TCP retransmits, as across
a real partition, and the connection lives on once the rule is gone.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from dataclasses import dataclass, field

_tables = itertools.count(1)
_gids = itertools.count(0)


def missing() -> str | None:
    """Why kernel faults cannot be injected here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root (nftables rules on lo)"
    if shutil.which("nft") is None:
        return "needs nft (apt-get install nftables)"
    probe = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"nft cannot list tables: {probe.stderr.strip()}"
    return None


def fresh_gid() -> int:
    """A group id of its own: one per call in this process (up to 4,096), and apart from
    other processes' (by pid), so a rule on it cuts off one party only."""
    return 100_000 + (os.getpid() % 100_000) * 4_096 + next(_gids) % 4_096


def _nft(*args: str, stdin: str | None = None) -> str:
    done = subprocess.run(["nft", *args], input=stdin, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"nft {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


@dataclass
class Nft:
    """One test's nftables table on `lo`; `close()` deletes it and every rule in it."""

    name: str = field(default_factory=lambda: f"rlslice_t{os.getpid()}_{next(_tables)}")
    _open: bool = False

    def open(self) -> Nft:
        _nft(
            "-f",
            "-",
            stdin=(
                f"table inet {self.name} {{\n"
                "  chain out { type filter hook output priority 0; policy accept; }\n"
                "}\n"
            ),
        )
        self._open = True
        return self

    def cut(self, gid: int, port: int) -> int:
        """Drop every packet the sockets of group `gid` send on lo to `port`; the rule's
        handle (for `heal`)."""
        out = _nft(
            "--echo",
            "--handle",
            "add",
            "rule",
            "inet",
            self.name,
            "out",
            "oifname",
            "lo",
            "meta",
            "skgid",
            str(gid),
            "ip",
            "daddr",
            "127.0.0.0/8",
            "tcp",
            "dport",
            str(port),
            "drop",
        )
        return int(out.rsplit("# handle", 1)[1].split()[0])

    def cut_link(self, port: int) -> list[int]:
        """Cut every connection to and from `port` on lo, both ways (the server that
        listens there is partitioned from all its peers); the rules' handles."""
        handles = []
        for direction in ("dport", "sport"):
            out = _nft(
                "--echo", "--handle", "add", "rule", "inet", self.name, "out",
                "oifname", "lo", "ip", "daddr", "127.0.0.0/8", "tcp", direction, str(port), "drop",
            )  # fmt: skip
            handles.append(int(out.rsplit("# handle", 1)[1].split()[0]))
        return handles

    def heal(self, handle: int) -> None:
        """Remove one rule."""
        _nft("delete", "rule", "inet", self.name, "out", "handle", str(handle))

    def rules(self) -> str:
        return _nft("list", "table", "inet", self.name)

    def close(self) -> None:
        if self._open:
            self._open = False
            _nft("delete", "table", "inet", self.name)
