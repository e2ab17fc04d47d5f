"""`rlslice bench spill`: the agent's disk tier beside a plain copy, in one run.

1. Throughput (default): a parked part of `--size` bytes in host memory (a file in
   /dev/shm, as the `sim` backend parks) is spilled to `--dir` by the agent's own code
   (`snapshot_agent.spill.write_part`: pipelined, checksummed, O_DIRECT where allowed) and
   read back verified (`read_part`); beside each, a plain sequential copy of the same bytes
   into the same directory (8 MiB reads and writes, buffered, fsynced) and back. Every
   timed copy ends on the disk (fsync) and every read starts cold: the file's cached pages
   are dropped (posix_fadvise DONTNEED, and /proc/sys/vm/drop_caches when writable).
   The runs alternate, `--repeats` of each; medians. Target: write and read each >= 0.8 x
   the plain copy (`write_ratio`, `read_ratio`).
2. `--oversubscribe`: 4 real jobs on one node (`sim` backend, an agent in this process),
   the 3 parked at any time holding 3x the agent's host budget, take turns (one Switch per turn), each
   >= `--turns` times; every turn's bytes are checked (crc32 in the job). Measured: the
   most parked bytes in host memory (sampled in a thread), this process's RSS growth
   (the agent's: its spill buffers), bytes spilled and filled. Target: parked host bytes
   plus RSS growth within the budget plus `--slack`, every byte identical.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rlslice.apps.shared.flags import size as parse_size

RATIO_TARGET = 0.8
_PLAIN_CHUNK = 8 << 20


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", default="1GiB", help="bytes of the part (1GiB)")
    parser.add_argument(
        "--dir", default="", help="spill directory to measure (default: a folder in /var/tmp)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs of each copy (median)")
    parser.add_argument(
        "--oversubscribe", action="store_true", help="4 jobs over 3x the host budget instead"
    )
    parser.add_argument(
        "--job-size", default="64MiB", help="--oversubscribe: state of each job (64MiB)"
    )
    parser.add_argument("--turns", type=int, default=5, help="--oversubscribe: turns per job")
    parser.add_argument(
        "--slack", default="64MiB", help="--oversubscribe: RSS allowed over the budget (64MiB)"
    )


def run(args: argparse.Namespace) -> int:
    import json

    base = (
        Path(args.dir)
        if args.dir
        else Path(tempfile.mkdtemp(prefix="rlslice-spill-", dir="/var/tmp"))
    )
    base.mkdir(parents=True, exist_ok=True)
    try:
        if args.oversubscribe:
            import asyncio

            from rlslice.apps.bench._spill_over import oversubscribe

            result = asyncio.run(
                oversubscribe(
                    base,
                    job_size=parse_size(args.job_size),
                    turns=args.turns,
                    slack=parse_size(args.slack),
                )
            )
        else:
            result = throughput(base, parse_size(args.size), max(1, args.repeats))
    finally:
        if not args.dir:
            import shutil

            shutil.rmtree(base, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>24}: {value}")
    return 0 if result.get("ok") else 1


def _drop(path: Path) -> None:
    """Drop `path`'s cached pages (and the whole page cache where allowed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        Path("/proc/sys/vm/drop_caches").write_text("1\n")


def _plain_copy(source: Path, target: Path, *, sync: bool) -> None:
    """A plain sequential copy: 8 MiB reads and writes, fsynced when `sync`."""
    buffer = bytearray(_PLAIN_CHUNK)
    view = memoryview(buffer)
    with open(source, "rb", buffering=0) as inp, open(target, "wb", buffering=0) as out:
        while count := inp.readinto(buffer):
            out.write(view[:count])
        if sync:
            os.fsync(out.fileno())


def _timed(work: Any, *args: Any, **kwargs: Any) -> float:
    started = time.perf_counter()
    work(*args, **kwargs)
    return time.perf_counter() - started


def throughput(base: Path, size: int, repeats: int) -> dict[str, Any]:
    """Agent spill and fill GB/s beside a plain copy of the same bytes, same directory."""
    import zlib

    from rlslice.snapshot_agent import spill

    host = Path(tempfile.mkdtemp(prefix="rlslice-spill-host-", dir="/dev/shm"))
    try:
        source = host / "part.bin"
        block = os.urandom(1 << 20)
        with open(source, "wb") as out:
            for _ in range(size >> 20):
                out.write(block)
            out.write(block[: size % (1 << 20)])
        times: dict[str, list[float]] = {k: [] for k in ("aw", "pw", "ar", "pr")}
        for _ in range(repeats):
            spilled, plain, back = base / "agent.bin", base / "plain.bin", host / "back.bin"
            started = time.perf_counter()
            record = spill.write_part(source, spilled)
            times["aw"].append(time.perf_counter() - started)
            times["pw"].append(_timed(_plain_copy, source, plain, sync=True))
            _drop(spilled)
            times["ar"].append(_timed(spill.read_part, record, back))
            identical = zlib.crc32(back.read_bytes()) == zlib.crc32(source.read_bytes())
            back.unlink()
            _drop(plain)
            times["pr"].append(_timed(_plain_copy, plain, back, sync=False))
            back.unlink()
            for path in (spilled, plain):
                path.unlink()
        rate = {k: size / statistics.median(v) / 1e9 for k, v in times.items()}
        identical = identical and record.length == size
    finally:
        import shutil

        shutil.rmtree(host, ignore_errors=True)
    result: dict[str, Any] = {
        "size_bytes": size,
        "dir": str(base),
        "repeats": repeats,
        "agent_write_gbps": round(rate["aw"], 3),
        "plain_write_gbps": round(rate["pw"], 3),
        "agent_read_gbps": round(rate["ar"], 3),
        "plain_read_gbps": round(rate["pr"], 3),
        "write_ratio": round(rate["aw"] / rate["pw"], 3),
        "read_ratio": round(rate["ar"] / rate["pr"], 3),
        "identical": identical,
        "target": RATIO_TARGET,
    }
    result["ok"] = bool(
        identical and result["write_ratio"] >= RATIO_TARGET and result["read_ratio"] >= RATIO_TARGET
    )
    return result
