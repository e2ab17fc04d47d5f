"""Real storage faults for the fault tests: a small tmpfs mounted for one test, filled up.

`SmallFs(path).mount()` mounts a tmpfs of a few hundred KiB at `path` (root only);
`fill()` writes a filler file until the filesystem says ENOSPC, `free()` deletes it;
`close()` unmounts (lazily, so an open SQLite file never keeps the mount behind).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


def missing() -> str | None:
    """Why a filesystem cannot be mounted here, or None when it can."""
    if os.geteuid() != 0:
        return "needs root (mount -t tmpfs)"
    if shutil.which("mount") is None:
        return "needs mount"
    return None


@dataclass
class SmallFs:
    path: Path
    size_kib: int = 512
    _mounted: bool = False

    @property
    def filler(self) -> Path:
        return self.path / "filler"

    def mount(self) -> SmallFs:
        self.path.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.size_kib}k", "tmpfs", str(self.path)],
            check=True,
            capture_output=True,
        )
        self._mounted = True
        return self

    def fill(self) -> int:
        """Write until ENOSPC; the bytes written."""
        written = 0
        with open(self.filler, "ab", buffering=0) as handle:
            for chunk in (65536, 4096, 512, 1):
                while True:
                    try:
                        written += handle.write(b"\0" * chunk)
                    except OSError as error:
                        if error.errno != errno.ENOSPC:
                            raise
                        break
        return written

    def free(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.filler.unlink()

    def close(self) -> None:
        if self._mounted:
            self._mounted = False
            subprocess.run(["umount", "-l", str(self.path)], check=False, capture_output=True)
