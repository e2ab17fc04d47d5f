"""`python -m rlslice.apps.bench.soak.scheduler [--agent-rpc-timeout S] [--agent-status-timeout S] FLAGS`

The real `rlslice scheduler` command (the same flags, settings and server), with the
coordinator's agent call deadlines settable: the fault tests cut a scheduler off from an
agent and must see the switch give up within seconds, not the production minute. Not a
command of its own: the fault tests start it, passing `argv(seconds)` as
`rlslice.testing.Cluster(scheduler_command=...)`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from rlslice.apps import scheduler as command


def argv(agent_rpc_timeout: float) -> list[str]:
    """The command line of this entry point with the agent call deadline `agent_rpc_timeout`
    (and Status calls' deadline at most 5 s), before the scheduler's own flags."""
    return [
        sys.executable,
        "-m",
        "rlslice.apps.bench.soak.scheduler",
        "--agent-rpc-timeout",
        repr(agent_rpc_timeout),
        "--agent-status-timeout",
        repr(min(5.0, agent_rpc_timeout)),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlslice-soak-scheduler")
    parser.add_argument("--agent-rpc-timeout", type=float, default=60.0)
    parser.add_argument("--agent-status-timeout", type=float, default=5.0)
    parser.add_argument("--log-level", default="WARNING")
    command.configure(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(message)s")
    settings = command.settings_from(args).model_copy(
        update={
            "rpc_timeout_seconds": args.agent_rpc_timeout,
            "status_timeout_seconds": args.agent_status_timeout,
        }
    )
    asyncio.run(command.serve(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
