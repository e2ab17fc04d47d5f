"""`python -m rlslice.apps.bench.soak.scheduler [--agent-rpc-timeout S] [--agent-status-timeout S] FLAGS`

The real `rlslice scheduler` command (the same flags, settings and server), with the
coordinator's agent call deadlines settable: the fault tests cut a scheduler off from an
agent and must see the switch give up within seconds, not the production minute. Not a
command of its own: only the fault tests and the soak start it (`Cluster`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from rlslice.apps import scheduler as command


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
