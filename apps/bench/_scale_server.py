"""The scheduler side of `rlslice bench scale`: a scheduler in a child process, with its CPU
time, resident memory, event-loop lag and collector pauses readable from the driver.

`python -m rlslice.apps.bench._scale_server` starts a scheduler (in-memory store, groups created
on first Register) and prints its address. Lines on its stdin: `start` and `end` bound the
measured window; at the end of stdin it prints the window's stall figures (event-loop lag,
garbage-collector pauses) as one JSON line and stops. RLSLICE_BENCH_PROFILE=path profiles it with cProfile into `path`.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

from rlslice.apps.bench._scale_figures import percentile


class Stalls:
    """Inside the scheduler process: event-loop lag and garbage-collector pauses, the two
    things that stretch a p99 without showing in CPU per call."""

    TICK = 0.01

    def __init__(self) -> None:
        import gc

        self.lags: list[float] = []
        self.gc_pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self._gc_started = 0.0
        gc.callbacks.append(self._on_gc)

    def close(self) -> None:
        import gc

        gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self.gc_pauses[info["generation"]].append(time.perf_counter() - self._gc_started)

    def reset(self) -> None:
        """Forget what was seen so far (the measured window starts now)."""
        self.lags.clear()
        for pauses in self.gc_pauses.values():
            pauses.clear()

    async def watch_loop(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(self.TICK)
            self.lags.append(time.perf_counter() - before - self.TICK)

    def report(self) -> dict[str, float]:
        import gc

        full = self.gc_pauses[2]
        return {
            "gc_tracked_objects": float(len(gc.get_objects())),
            "loop_lag_p99_ms": percentile(self.lags, 99) * 1000,
            "loop_lag_max_ms": max(self.lags, default=0.0) * 1000,
            "gc_full_collections": float(len(full)),
            "gc_full_pause_max_ms": max(full, default=0.0) * 1000,
            "gc_young_pause_max_ms": max(self.gc_pauses[0] + self.gc_pauses[1], default=0.0) * 1000,
        }


async def _serve() -> None:
    """Run a scheduler; print its address; on stdin's end print the stall figures of the window
    (between "start" and "end" lines on stdin) as JSON, and stop.

    With RLSLICE_BENCH_PROFILE=path the whole run is profiled with cProfile into `path`.
    """
    from rlslice.scheduler import SchedulerSettings, start_scheduler

    stalls = Stalls()
    running = await start_scheduler(
        SchedulerSettings(address="127.0.0.1:0", store="memory", auto_create_groups=True)
    )
    print(running.address, flush=True)
    watcher = asyncio.create_task(stalls.watch_loop())
    loop = asyncio.get_running_loop()
    report: dict[str, float] | None = None
    # One command per stdin line: "start" and "end" bound the measured window; the end of
    # stdin stops the scheduler after printing the window's figures.
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        if line.strip() == "start":
            stalls.reset()
        elif line.strip() == "end":
            report = stalls.report()
    watcher.cancel()
    print(json.dumps(report or stalls.report()), flush=True)
    await running.stop(0.5)


def _serve_main() -> None:
    path = os.environ.get("RLSLICE_BENCH_PROFILE")
    if not path:
        asyncio.run(_serve())
        return
    import cProfile

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        asyncio.run(_serve())
    finally:
        profiler.disable()
        profiler.dump_stats(path)


class SchedulerProcess:
    """A scheduler in a child process, with its CPU and memory readable."""

    def __init__(self, profile: str | None = None) -> None:
        env = {**os.environ, "PYTHONSAFEPATH": "1"}
        if profile:
            env["RLSLICE_BENCH_PROFILE"] = profile
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "rlslice.apps.bench._scale_server"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.popen.stdout is not None
        line = self.popen.stdout.readline().strip()
        if not line:
            self.popen.kill()
            raise RuntimeError("the scheduler subprocess did not start (see its stderr)")
        self.address = line
        import psutil

        self.process = psutil.Process(self.popen.pid)

    def cpu_seconds(self) -> float:
        times = self.process.cpu_times()
        return float(times.user + times.system)

    def rss(self) -> int:
        return int(self.process.memory_info().rss)

    def peak_rss(self) -> int:
        """VmHWM (Linux); the current RSS elsewhere."""
        try:
            with open(f"/proc/{self.popen.pid}/status") as status:
                for line in status:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return self.rss()

    def mark(self, command: str) -> None:
        """Tell the scheduler process that the measured window starts or ends."""
        assert self.popen.stdin is not None
        self.popen.stdin.write(f"{command}\n")
        self.popen.stdin.flush()

    def stop(self) -> dict[str, float]:
        """Stop the scheduler; return the stall figures it printed."""
        assert self.popen.stdin is not None
        assert self.popen.stdout is not None
        self.popen.stdin.close()
        line = self.popen.stdout.readline().strip()
        try:
            self.popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
        try:
            return {k: float(v) for k, v in json.loads(line).items()}
        except ValueError:
            return {}


if __name__ == "__main__":
    _serve_main()
