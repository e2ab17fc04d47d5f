"""The job table's file on disk: two slots written in place, the newer whole one wins.

A switch writes the table twice (its begun records, then its end), on the switch's path.
Writing a temporary file and renaming it over the old one is atomic, but on ext4 (and
XFS) a rename over an existing file starts the new file's writeback at once
(`auto_da_alloc`): about half a millisecond on a busy node, twice per switch. So the
table alternates between two slot files, `jobs.0` and `jobs.1`, overwriting the older in
place (no rename, no truncate to zero). Each slot starts with a header line naming its
sequence number, payload length and CRC32; a read takes the slot of the highest sequence
whose payload checks, so a write torn by a crash leaves the other slot, the table as it
was before that unit of work. A table written by an older agent (`jobs.json`, whole JSON)
is read when no slot exists yet, and removed once the first slot is written (an agent
downgraded past this change then starts with no table rather than a stale one).
"""

from __future__ import annotations

import logging
import os
import zlib
from pathlib import Path

log = logging.getLogger(__name__)

LEGACY_FILE = "jobs.json"
"""Where an older agent kept the table (one JSON document, renamed into place)."""
SLOT_FILES = ("jobs.0", "jobs.1")
MAGIC = b"rlslice-jobs"


class TableFile:
    """Read the newest whole table payload; write the next one into the older slot."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self._sequence = 0  # of the payload last read or written; 0 before any
        self._ready = False  # the directory made

    @property
    def path(self) -> Path:
        """The slot that holds the newest payload (the next write goes to the other)."""
        return self.state_dir / SLOT_FILES[self._sequence % 2]

    def read(self) -> str | None:
        """The newest whole payload, None when there is none yet. A damaged slot is logged
        and passed over; OSError when a slot cannot be read at all."""
        found: list[tuple[int, str]] = []
        for name in SLOT_FILES:
            slot = self.state_dir / name
            try:
                data = slot.read_bytes()
            except FileNotFoundError:
                continue
            parsed = _parse(data)
            if parsed is None:
                log.warning("%s is torn or damaged: the other slot is used", slot)
                continue
            found.append(parsed)
        if found:
            self._sequence, payload = max(found)
            return payload
        if any((self.state_dir / name).exists() for name in SLOT_FILES):
            raise ValueError(f"no whole table in {self.state_dir}/{'|'.join(SLOT_FILES)}")
        legacy = self.state_dir / LEGACY_FILE
        try:
            return legacy.read_text()
        except FileNotFoundError:
            return None

    def write(self, payload: str) -> None:
        """`payload` as the newest table, over the older slot, in place."""
        if not self._ready:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            self._ready = True
        sequence = self._sequence + 1
        body = payload.encode()
        header = b"%s %d %d %08x\n" % (MAGIC, sequence, len(body), zlib.crc32(body))
        data = header + body
        slot = self.state_dir / SLOT_FILES[sequence % 2]
        fd = os.open(slot, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            written = os.pwrite(fd, data, 0)
            if written != len(data):
                raise OSError(f"short write to {slot}: {written} of {len(data)} bytes")
            # Shorter than the last payload in this slot: cut the stale tail (the header's
            # length already excludes it; this keeps the file readable by eye).
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)
        if self._sequence == 0:
            (self.state_dir / LEGACY_FILE).unlink(missing_ok=True)
        self._sequence = sequence


def _parse(data: bytes) -> tuple[int, str] | None:
    """(sequence, payload) of a slot's bytes, None when torn or not a slot."""
    header, newline, rest = data.partition(b"\n")
    fields = header.split(b" ")
    if not newline or len(fields) != 4 or fields[0] != MAGIC:
        return None
    try:
        sequence, length, crc = int(fields[1]), int(fields[2]), int(fields[3], 16)
    except ValueError:
        return None
    body = rest[:length]
    if len(body) != length or zlib.crc32(body) != crc:
        return None
    try:
        return sequence, body.decode()
    except UnicodeDecodeError:
        return None
