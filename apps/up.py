"""`rlslice up`: a scheduler and this node's agent in one process (laptop, one node, Slurm).

The scheduler keeps its state in SQLite (default under the user's state directory) and
creates a group with default settings the first time a job registers in it; the agent
joins the scheduler over loopback like any remote agent would, so what runs here is what
runs on a cluster. Stops cleanly on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from pathlib import Path
from typing import Any

from rlslice.apps.shared.flags import size

log = logging.getLogger("rlslice.up")


def default_store() -> Path:
    """`<user state dir>/rlslice/scheduler.sqlite`."""
    import platformdirs

    return Path(platformdirs.user_state_dir("rlslice")) / "scheduler.sqlite"


def configure(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    parser.add_argument(
        "--address",
        default=env("RLSLICE_SCHEDULER_ADDRESS", "127.0.0.1:50551"),
        help="scheduler gRPC address (default 127.0.0.1:50551)",
    )
    parser.add_argument(
        "--store",
        type=Path,
        default=None,
        help="SQLite file of the scheduler's state (default: under the user's state dir)",
    )
    parser.add_argument(
        "--metrics-port", type=int, default=None, help="Prometheus port of the scheduler"
    )
    parser.add_argument(
        "--group-config",
        type=Path,
        default=None,
        help="YAML file: group specs created at start (a list, or {groups: [...]}); "
        "other groups are created with defaults when a job first registers",
    )
    parser.add_argument("--node", default=None, help="node name (default: the host name)")
    parser.add_argument(
        "--agent-address", default="127.0.0.1:0", help="agent gRPC address (loopback)"
    )
    parser.add_argument("--socket", type=Path, default=None, help="agent Unix socket path")
    parser.add_argument("--state-dir", type=Path, default=None, help="agent state directory")
    parser.add_argument(
        "--backend", default="sim", help="default backend: sim, cuda, cuda-checkpoint, app"
    )
    parser.add_argument("--sim-root", type=Path, default=None, help="sim shared-memory root")
    parser.add_argument("--sim-devices", type=int, default=1, help="emulated devices")
    # Spelled as `rlslice agent` spells them; the old *-bytes spellings stay as aliases.
    parser.add_argument(
        "--sim-capacity",
        "--sim-capacity-bytes",
        dest="sim_capacity_bytes",
        type=size,
        default=16 << 30,
        help="sim: memory of each emulated device (default 16GiB)",
    )
    parser.add_argument(
        "--sim-rate-gbps", type=float, default=25.0, help="emulated copy rate (0: unlimited)"
    )
    parser.add_argument(
        "--sim-overhead-seconds", type=float, default=0.0, help="fixed cost per move"
    )
    parser.add_argument(
        "--host-reserve",
        "--host-reserve-bytes",
        dest="host_reserve_bytes",
        type=size,
        default=1 << 30,
        help="host memory kept free when parking (default 1GiB)",
    )


async def serve(args: argparse.Namespace, stop: asyncio.Event | None = None) -> None:
    """Run scheduler and agent until SIGTERM/SIGINT (or `stop` is set), then stop both."""
    from rlslice.adapters.server import serve_until_signal

    async def stop_both(running: tuple[Any, Any]) -> None:
        scheduler, agent = running
        await agent.stop(2.0)
        await scheduler.stop(2.0)

    await serve_until_signal(lambda: start(args), stop_both, until=stop)


async def start(args: argparse.Namespace) -> tuple[Any, Any]:
    """The started scheduler and agent, their addresses printed."""
    from rlslice.config import load_group_config
    from rlslice.scheduler import SchedulerSettings, start_scheduler
    from rlslice.snapshot_agent import AgentSettings, start_agent
    from rlslice.snapshot_agent.settings import SimSettings

    store = args.store or default_store()
    store.parent.mkdir(parents=True, exist_ok=True)
    scheduler = await start_scheduler(
        SchedulerSettings(
            address=args.address,
            store=str(store),
            metrics_port=args.metrics_port,
            auto_create_groups=True,
            groups=() if args.group_config is None else load_group_config(args.group_config),
        )
    )
    sim = {
        "devices": args.sim_devices,
        "capacity_bytes": args.sim_capacity_bytes,
        "rate_gbps": args.sim_rate_gbps,
        "overhead_seconds": args.sim_overhead_seconds,
    }
    if args.sim_root is not None:
        sim["root"] = args.sim_root
    agent_fields: dict[str, object] = {
        "address": args.agent_address,
        "backend": args.backend,
        "sim": SimSettings(**sim),
        "host_reserve_bytes": args.host_reserve_bytes,
        "scheduler": scheduler.address,
    }
    for name, value in (
        ("node", args.node),
        ("socket_path", args.socket),
        ("state_dir", args.state_dir),
    ):
        if value is not None:
            agent_fields[name] = value
    try:
        agent = await start_agent(AgentSettings(**agent_fields))  # type: ignore[arg-type]
    except BaseException:
        await scheduler.stop(0)
        raise
    log.warning(
        "rlslice up: scheduler on %s (store %s), agent %s on %s, socket %s",
        scheduler.address,
        store,
        agent.node,
        agent.address,
        agent.socket_path,
    )
    print(f"scheduler {scheduler.address}", flush=True)
    print(f"agent {agent.node} {agent.address} socket {agent.socket_path}", flush=True)
    return scheduler, agent


def run(args: argparse.Namespace) -> int:
    asyncio.run(serve(args))
    return 0
