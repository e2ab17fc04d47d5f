"""The `rlslice` command: a thin dispatcher over subcommands that live beside their code.

Each entry of `COMMANDS` names a module with `configure(parser)` and `run(args) -> int`, a
one-line help, and the extras the command needs. Nothing is imported at parse time but the
chosen command's module: `rlslice --help` imports no command at all, `rlslice status`
imports only `rlslice.apps.status`. Command modules keep their component imports (grpc
servers, kopf, matplotlib, torch) inside `run`, so a plain `pip install rlslice` (the base
install a training job needs) runs `--help`, `run` and `status`.

A command whose extra is missing exits 2 with one line naming it:

    rlslice agent needs the agent extra: pip install 'rlslice[agent]'

The missing module decides which extra: the command's own extras first (`up` needs
`scheduler` and `agent`), else the extra that declares the module (`timeline --out x.png`
on a base install needs `planner` for matplotlib). `MODULE_EXTRAS` is that table;
tests/deploy/packaging checks it against pyproject.toml.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from typing import NamedTuple

from rlslice._version import __version__


class Command(NamedTuple):
    """One subcommand: where it lives, its help line, the extras it cannot run without."""

    module: str
    help: str
    extras: tuple[str, ...] = ()


COMMANDS: dict[str, Command] = {
    "up": Command(
        "rlslice.apps.up",
        "run a scheduler and an agent in one process (standalone)",
        ("scheduler", "agent"),
    ),
    "scheduler": Command("rlslice.apps.scheduler", "run the scheduler", ("scheduler",)),
    "agent": Command("rlslice.apps.agent", "run the snapshot agent of this node", ("agent",)),
    "probe": Command("rlslice.apps.probe", "list the backends usable on this node"),
    "run": Command("rlslice.apps.run", "run a command as a job registered with the local agent"),
    "status": Command("rlslice.apps.status", "show groups: holder, queue, resident, parked, epoch"),
    "top": Command("rlslice.apps.top", "live view of every group", ("console",)),
    "timeline": Command(
        "rlslice.apps.timeline.command", "export a group's timeline (Chrome trace JSON, PNG)"
    ),
    "demo": Command(
        "rlslice.apps.demo.command",
        "two RL-shaped jobs, dedicated vs time-sliced, on the sim backend",
        ("scheduler", "agent", "planner", "console"),
    ),
    "bench": Command(
        "rlslice.apps.bench",
        "benchmarks: handoff, switch, swap, scale, spill, soak, advise",
        ("scheduler", "agent", "planner"),
    ),
    "operator": Command(
        "rlslice.apps.operator", "run the Kubernetes operator (kopf)", ("operator",)
    ),
    "plan": Command("rlslice.apps.plan", "check whether jobs fit on nodes", ("planner",)),
    "simulate": Command("rlslice.apps.simulate", "simulate interleaving jobs on one group"),
    "diagnose": Command("rlslice.apps.diagnose", "hypotheses from a scheduler's metrics"),
    "profile": Command(
        "rlslice.apps.profile",
        "a job's phase profile (YAML) from a scheduler's events",
        ("planner",),
    ),
    "completion": Command(
        "rlslice.apps.completion", "print a shell completion script (bash or zsh)"
    ),
    "advise": Command(
        "rlslice.apps.advise",
        "which jobs should share GPUs: ranked pairings and group definitions",
        ("planner", "console"),
    ),
}

#: third-party top-level module -> the extras of pyproject.toml that install it
MODULE_EXTRAS: dict[str, tuple[str, ...]] = {
    "grpc_health": ("scheduler", "agent"),
    "grpc_reflection": ("scheduler", "agent"),
    "prometheus_client": ("scheduler", "agent", "planner"),
    "platformdirs": ("agent",),
    "psutil": ("agent",),
    "yaml": ("scheduler", "planner"),
    "rich": ("console",),
    "kubernetes_asyncio": ("scheduler", "agent", "operator"),
    "aiohttp": ("scheduler", "agent", "operator"),
    "cryptography": ("operator",),
    "cuda": ("cuda",),
    "pynvml": ("cuda",),
    "kopf": ("operator",),
    "jsonpatch": ("operator",),
    "numpy": ("planner",),
    "matplotlib": ("planner",),
    "opentelemetry": ("tracing",),
}


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _command_in(argv: Sequence[str]) -> str | None:
    """The subcommand named in `argv` (its first positional), or None."""
    items = iter(argv)
    for item in items:
        if item == "--log-level":
            next(items, None)
        elif not item.startswith("-"):
            return item
    return None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The argument parser. Every subcommand is listed; each is configured (its module
    imported) unless `only` names another one: `main` configures just the chosen one."""
    # No abbreviations: `--token x` must never be taken for `--token-file x`, and a flag
    # added later must never change what an old abbreviation meant.
    parser = argparse.ArgumentParser(
        prog="rlslice",
        description="Time-slice GPUs between reinforcement-learning jobs.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"rlslice {__version__}")
    parser.add_argument("--log-level", default="INFO", choices=LOG_LEVELS)
    # Also accepted after the subcommand (`rlslice status --log-level DEBUG`); SUPPRESS keeps
    # the top-level value when it is not repeated there.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--log-level", default=argparse.SUPPRESS, choices=LOG_LEVELS)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, command in COMMANDS.items():
        subparser = sub.add_parser(
            name,
            help=command.help,
            description=command.help,
            parents=[common],
            allow_abbrev=False,
        )
        if only is None or only == name:
            module = importlib.import_module(command.module)
            module.configure(subparser)
            subparser.set_defaults(_run=module.run)
    return parser


def missing_extra_message(command: str, module: str) -> str | None:
    """The one line for `command` failing on the missing third-party `module`, or None when
    no extra installs it (a bug or a broken install: let the traceback show)."""
    top = module.partition(".")[0]
    provided_by = MODULE_EXTRAS.get(top)
    if provided_by is None:
        return None
    needed = COMMANDS[command].extras if command in COMMANDS else ()
    # The command's own extras when the module is one of theirs (`up` names both), else
    # the first extra that installs the module (an optional feature of the command).
    extras = list(needed) if set(needed) & set(provided_by) else [provided_by[0]]
    noun = "extra" if len(extras) == 1 else "extras"
    names = extras[0] if len(extras) == 1 else ", ".join(extras[:-1]) + " and " + extras[-1]
    return f"rlslice {command} needs the {names} {noun}: pip install 'rlslice[{','.join(extras)}]'"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `rlslice` console script."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    chosen = _command_in(arguments)
    only = chosen if chosen in COMMANDS else ""  # "": none (argparse reports a bad name)
    try:
        parser = build_parser(only=only)
        args = parser.parse_args(arguments)
        logging.basicConfig(
            level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        if not getattr(args, "_run", None):
            parser.print_help()
            return 2
        return int(args._run(args) or 0)
    except ModuleNotFoundError as error:
        message = missing_extra_message(chosen or "", error.name or "")
        if message is None:
            raise
        print(message, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
