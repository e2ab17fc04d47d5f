"""`rlslice bench switch`: how long a switch takes on the `sim` backend, next to memcpy.

For each state size, two real job processes allocate that much emulated device memory
through `rlslice.client.sim` and register with a real agent (in this process, gRPC on
loopback, unlimited copy rate). A switch is Snapshot(outgoing) then Restore(incoming),
timed at the caller. Between switches, a plain memcpy of the same bytes is timed into
fresh pages (`memcpy_seconds`: the agent's copies land in fresh pages too, host memory on
the way out and freed-then-regrown device memory on the way in) and again into the same,
warm, pages (`memcpy_warm_seconds`, for reference). Target: switch <= 1.5 x two fresh
copies + 20 ms.
The bytes of both jobs are checked (crc32) after the last switch.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

DEFAULT_SIZES = "64MiB,256MiB,1GiB,2GiB"

_JOB = r"""
import sys, zlib
import numpy as np
from rlslice.client import sim
from rlslice.client import register_with_agent
socket_path, node_dir, job, size, seed = sys.argv[1:6]
register_with_agent(socket_path, job, "bench")
buffer = sim.attach(job=job, node_dir=node_dir).alloc(int(size), tag="state")
block = np.random.default_rng(int(seed)).integers(0, 256, 1 << 20, dtype=np.uint8)
view = np.frombuffer(buffer, dtype=np.uint8)
for start in range(0, view.size, block.size):
    part = view[start : start + block.size]
    part[:] = block[: part.size]
print(zlib.crc32(buffer), flush=True)
for line in sys.stdin:
    print(zlib.crc32(buffer), flush=True)
"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sizes", default=DEFAULT_SIZES, help=f"state sizes, comma-separated ({DEFAULT_SIZES})"
    )
    parser.add_argument("--repeats", type=int, default=5, help="switches per size (median kept)")


def run(args: argparse.Namespace) -> int:
    import asyncio
    import json
    import logging
    import shutil
    import tempfile

    from rlslice.apps.agent import parse_size

    logging.getLogger("rlslice.snapshot_agent").setLevel(logging.WARNING)

    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    # Emulated devices and parked copies in shared memory; the socket in a short path.
    root = Path(tempfile.mkdtemp(prefix="rlslice-bench-", dir=_shm()))
    work = Path(tempfile.mkdtemp(prefix="rsb-", dir="/tmp"))
    try:
        results = asyncio.run(_bench(sizes, max(1, args.repeats), root, work))
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps({"bench": "switch", "backend": "sim", "sizes": results}))
    else:
        print(f"{'state':>9} {'switch':>9} {'snapshot':>9} {'restore':>9} {'memcpy':>9} "
              f"{'warm':>8} {'ratio':>6} {'target':>9}  ok  identical")  # fmt: skip
        for r in results:
            print(
                f"{_mib(r['bytes']):>9} {r['switch_seconds'] * 1e3:>7.1f}ms "
                f"{r['snapshot_seconds'] * 1e3:>7.1f}ms {r['restore_seconds'] * 1e3:>7.1f}ms "
                f"{r['memcpy_seconds'] * 1e3:>7.1f}ms {r['memcpy_warm_seconds'] * 1e3:>6.1f}ms "
                f"{r['ratio']:>6.2f} {r['target_seconds'] * 1e3:>7.1f}ms "
                f"{'yes' if r['meets_target'] else 'NO':>3}  {r['identical']}"
            )
        print("memcpy: one copy into fresh pages; warm: into touched pages; "
              "ratio: switch / two fresh copies; target: 1.5 x two fresh copies + 20 ms")  # fmt: skip
    ok = all(r["meets_target"] and r["identical"] for r in results)
    return 0 if ok else 1


def _shm() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") else None


def _mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 30):g}GiB" if nbytes >= 1 << 30 else f"{nbytes >> 20}MiB"


def _memcpy(source: Any) -> tuple[float, float]:
    """Seconds to copy `source` into fresh pages (an anonymous mapping never touched), and
    again into the same, now warm, pages."""
    import mmap
    import time

    import numpy as np

    mapping = mmap.mmap(-1, source.size)
    target = np.frombuffer(mapping, dtype=np.uint8)
    started = time.perf_counter()
    np.copyto(target, source)
    fresh = time.perf_counter() - started
    started = time.perf_counter()
    np.copyto(target, source)
    warm = time.perf_counter() - started
    del target
    mapping.close()
    return fresh, warm


async def _bench(sizes: list[int], repeats: int, root: Path, work: Path) -> list[dict[str, Any]]:
    from rlslice.snapshot_agent import AgentSettings, SimSettings, start_agent

    settings = AgentSettings(
        node="bench",
        state_dir=work / "state",
        socket_path=work / "agent.sock",
        host_reserve_bytes=0,
        sim=SimSettings(root=root, capacity_bytes=2 * max(sizes) + (64 << 20), rate_gbps=0.0),
    )
    agent = await start_agent(settings)
    try:
        return [await _one_size(agent, size, repeats) for size in sizes]
    finally:
        await agent.stop(0)


async def _one_size(agent: Any, size: int, repeats: int) -> dict[str, Any]:
    import asyncio
    import contextlib
    import statistics
    import sys
    import time

    import numpy as np

    from rlslice._errors import NotFoundError
    from rlslice.adapters.channel import open_channel
    from rlslice.v1alpha1 import agent_pb2 as apb
    from rlslice.v1alpha1 import agent_pb2_grpc

    node_dir = agent.settings.sim.root / agent.node
    jobs = {}
    for name, seed in (("bench-a", 1), ("bench-b", 2)):
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _JOB, str(agent.socket_path), str(node_dir), name,
            str(size), str(seed), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert process.stdout is not None
        jobs[name] = (process, int(await asyncio.wait_for(process.stdout.readline(), 300)))
    channel = open_channel(agent.address)
    stub: Any = agent_pb2_grpc.AgentStub(channel)
    try:
        epoch = 1
        await stub.Snapshot(apb.SnapshotRequest(job="bench-b", group="bench", epoch=epoch))
        switch, snapshot, restore, fresh, warm = [], [], [], [], []
        outgoing, incoming = "bench-a", "bench-b"
        source = np.full(size, 7, dtype=np.uint8)
        for _ in range(repeats):
            # The plain copy is timed between switches, under the same conditions.
            copy_fresh, copy_warm = _memcpy(source)
            fresh.append(copy_fresh)
            warm.append(copy_warm)
            epoch += 1
            started = time.perf_counter()
            out = await stub.Snapshot(apb.SnapshotRequest(job=outgoing, group="bench", epoch=epoch))
            into = await stub.Restore(apb.RestoreRequest(job=incoming, group="bench", epoch=epoch))
            switch.append(time.perf_counter() - started)
            snapshot.append(out.seconds)
            restore.append(into.seconds)
            outgoing, incoming = incoming, outgoing
        del source
        # Bring the parked one back too, then compare every job's bytes with the start.
        epoch += 1
        await stub.Restore(apb.RestoreRequest(job=incoming, group="bench", epoch=epoch))
        identical = True
        for process, crc in jobs.values():
            assert process.stdin is not None
            assert process.stdout is not None
            process.stdin.write(b"crc\n")
            await process.stdin.drain()
            identical &= int(await asyncio.wait_for(process.stdout.readline(), 300)) == crc
    finally:
        await channel.close(None)
        for process, _ in jobs.values():
            process.kill()
            await process.wait()
        for name in jobs:  # usually dropped already: their processes are gone
            with contextlib.suppress(NotFoundError):
                await agent.engine.release(name, "bench", force=True)
    memcpy = statistics.median(fresh)
    median = statistics.median(switch)
    target = 1.5 * 2 * memcpy + 0.020
    return {
        "bytes": size,
        "switch_seconds": median,
        "snapshot_seconds": statistics.median(snapshot),
        "restore_seconds": statistics.median(restore),
        "memcpy_seconds": memcpy,
        "memcpy_warm_seconds": statistics.median(warm),
        "two_copies_seconds": 2 * memcpy,
        "ratio": median / (2 * memcpy),
        "target_seconds": target,
        "meets_target": median <= target,
        "identical": identical,
    }
