"""fsync errors for the fault tests: the fsyncs of a real process fail with EIO on demand.

`FsyncFault(work, under).build()` compiles `fsyncfault.c` (with the C compiler) into
`work`; a process started with `env()` in its environment (LD_PRELOAD) then gets EIO from
every fsync and fdatasync of a file under `under` while `fail()` is on, and the real call
again after `heal()`. Its writes are untouched: what fails is what a disk whose write-back
fails reports (SQLite: SQLITE_IOERR_FSYNC, "disk I/O error"). device-mapper's error and
flakey targets would fail the block device itself, but are not there on every machine.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SOURCE = Path(__file__).with_name("fsyncfault.c")


def missing() -> str | None:
    """Why the shim cannot be built or loaded here, or None when it can."""
    if not sys.platform.startswith("linux"):
        return "needs Linux (LD_PRELOAD, /proc/self/fd)"
    if shutil.which("gcc") is None:
        return "needs gcc (to build the LD_PRELOAD shim)"
    return None


@dataclass
class FsyncFault:
    work: Path
    """Where the shim and its flag live (not under `under`)."""
    under: Path
    """The folder whose files' fsyncs fail."""

    @property
    def library(self) -> Path:
        return self.work / "fsyncfault.so"

    @property
    def flag(self) -> Path:
        return self.work / "fsync-fails"

    def build(self) -> FsyncFault:
        self.work.mkdir(parents=True, exist_ok=True)
        command = ["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror"]
        command += ["-o", str(self.library), str(SOURCE), "-ldl"]
        subprocess.run(command, check=True, capture_output=True)
        return self

    def env(self) -> dict[str, str]:
        """The variables that load the shim into a process started with them."""
        return {
            "LD_PRELOAD": str(self.library),
            "FAILFSYNC_FLAG": str(self.flag),
            "FAILFSYNC_UNDER": str(self.under.resolve()),
        }

    def fail(self) -> None:
        """From now on, every fsync under `under` fails with EIO."""
        self.flag.touch()

    def heal(self) -> None:
        """From now on, fsyncs run again."""
        self.flag.unlink(missing_ok=True)
