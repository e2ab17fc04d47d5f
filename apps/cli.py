"""The `rlslice` command: a thin dispatcher over subcommands that live beside their code.

Each entry names a module with `configure(parser)` and `run(args) -> int`. Modules are
imported when the parser is built, so they keep heavy imports (grpc servers, kopf,
matplotlib, torch) inside `run`.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from rlslice._version import __version__

#: subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "up": ("rlslice.apps.up", "run a scheduler and an agent in one process (standalone)"),
    "scheduler": ("rlslice.apps.scheduler", "run the scheduler"),
    "agent": ("rlslice.apps.agent", "run the snapshot agent of this node"),
    "probe": ("rlslice.apps.probe", "list the backends usable on this node"),
    "run": ("rlslice.apps.run", "run a command as a job registered with the local agent"),
    "status": ("rlslice.apps.status", "show groups: holder, queue, resident, parked, epoch"),
    "top": ("rlslice.apps.top", "live view of every group"),
    "timeline": ("rlslice.apps.timeline", "export a group's timeline (Chrome trace JSON, PNG)"),
    "demo": (
        "rlslice.apps.demo",
        "two RL-shaped jobs, dedicated vs time-sliced, on the sim backend",
    ),
    "bench": ("rlslice.apps.bench", "benchmarks: handoff, switch, swap, scale, soak"),
    "operator": ("rlslice.apps.operator", "run the Kubernetes operator (kopf)"),
    "plan": ("rlslice.apps.plan", "check whether jobs fit on nodes"),
    "simulate": ("rlslice.apps.simulate", "simulate interleaving jobs on one group"),
    "diagnose": ("rlslice.apps.diagnose", "hypotheses from a scheduler's metrics"),
}


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser; subcommands whose module is missing are left out."""
    parser = argparse.ArgumentParser(
        prog="rlslice", description="Time-slice GPUs between reinforcement-learning jobs."
    )
    parser.add_argument("--version", action="version", version=f"rlslice {__version__}")
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name and module_name.startswith(error.name):
                continue  # not built yet, or an extra that is not installed
            raise
        command = sub.add_parser(name, help=help_text, description=help_text)
        module.configure(command)
        command.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `rlslice` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
