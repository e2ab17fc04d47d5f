"""`rlslice bench NAME`: benchmarks that measure side by side in one run and print figures
and ratios (`--json` for one JSON object). Each bench is a module with `configure(parser)`
and `run(args) -> int`, listed here."""

from __future__ import annotations

import argparse
import importlib

#: bench name -> (module, one-line help)
BENCHES: dict[str, tuple[str, str]] = {
    "handoff": (
        "rlslice.apps.bench.handoff",
        "acquire/yield/handoff latency vs a bare gRPC round trip",
    ),
    "switch": (
        "rlslice.apps.bench.switch",
        "sim-backend switch time vs plain memcpy, by state size",
    ),
    "swap": (
        "rlslice.apps.bench.swap",
        "GPU swap of two torch jobs: cuda or app backend vs pinned memcpy",
    ),
    "scale": (
        "rlslice.apps.bench.scale",
        "acquire overhead and scheduler CPU/RSS at 10 vs 1,000 groups",
    ),
    "spill": (
        "rlslice.apps.bench.spill",
        "disk tier: agent spill/fill GB/s vs a plain copy; --oversubscribe 4 jobs over 3x budget",
    ),
    "soak": (
        "rlslice.apps.bench.soak.command",
        "random phases, kills and restarts; checks the invariants",
    ),
    "advise": (
        "rlslice.apps.bench.advise",
        "placement advisor: search time for 32 jobs, heuristic gap to exhaustive",
    ),
}


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", metavar="BENCH", required=True)
    for name, (module_name, help_text) in BENCHES.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name and module_name.startswith(error.name):
                continue
            raise
        bench = sub.add_parser(name, help=help_text, description=help_text)
        bench.add_argument("--json", action="store_true", help="print one JSON object")
        module.configure(bench)
        bench.set_defaults(_bench_run=module.run)


def run(args: argparse.Namespace) -> int:
    return int(args._bench_run(args) or 0)
