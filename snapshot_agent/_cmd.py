"""`rlslice agent`: run the snapshot agent of this node until SIGTERM / SIGINT.

Every flag can also come from the environment as `RLSLICE_AGENT_<FLAG>` (upper case, '-'
as '_'), e.g. `RLSLICE_AGENT_SCHEDULER=10.0.0.5:7070`; a flag given wins.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any

_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?(?:e[0-9]+)?)\s*([kmgt]i?b?|b)?\s*$", re.I)
_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_size(text: str) -> int:
    """Bytes from `1073741824`, `1GiB`, `512MiB`, `2G` (SI: powers of 1000) or `2GiB`."""
    match = _SIZE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (try 16GiB or 512MiB)")
    number, unit = float(match.group(1)), (match.group(2) or "").lower()
    if unit.endswith("ib") or (len(unit) == 2 and unit[1] == "i"):
        factor = 1 << (10 * "kmgt".index(unit[0]) + 10)
    else:
        factor = _UNITS[unit.rstrip("b")] if unit != "b" else 1
    return int(number * factor)


def _env(name: str) -> str | None:
    return os.environ.get("RLSLICE_AGENT_" + name.upper().replace("-", "_")) or None


def configure(parser: argparse.ArgumentParser) -> None:
    def add(flag: str, **kwargs: Any) -> None:
        parser.add_argument(f"--{flag}", default=_env(flag), **kwargs)

    add("node", help="node name, a DNS-1123 label (default: the host name)")
    add("address", help="TCP address of the Agent service (default 127.0.0.1:7071)")
    add("advertise-address", help="address the scheduler dials (default: the bound one)")
    add("socket", help="Unix socket for local registration")
    add("socket-mode", help="permission bits of the socket, octal (default 660)")
    add("state-dir", help="directory for job records (survives restarts)")
    add("backend", help="default backend: sim, cuda, cuda-checkpoint or app (default sim)")
    add("sim-devices", help="sim: emulated devices on this node (default 1)")
    add("sim-capacity", help="sim: memory of each emulated device (default 16GiB)")
    add("sim-rate-gbps", help="sim: copy rate in GB/s, 0 for unlimited (default 25)")
    add("sim-overhead-seconds", help="sim: fixed cost per move (default 0)")
    add("sim-root", help="sim: shared-memory folder (default /dev/shm/rlslice-sim)")
    add("host-reserve", help="host memory kept free when parking (default 1GiB)")
    add("scheduler", help="scheduler address to register with (host:port)")
    add("token", help="agent token (prefer --token-file or RLSLICE_AGENT_TOKEN)")
    add("token-file", help="file holding the agent token")
    add("tls-cert", help="PEM certificate of the Agent service")
    add("tls-key", help="PEM key of the Agent service")
    add("tls-client-ca", help="PEM CA that callers' certificates must chain to (mutual TLS)")
    add("scheduler-ca", help="PEM CA that verifies the scheduler (TLS to the scheduler)")
    add("metrics-port", help="port of the Prometheus endpoint (default: none)")
    parser.add_argument(
        "--label", action="append", default=[], help="node label key=value, for the scheduler"
    )


def settings_from(args: argparse.Namespace) -> Any:
    """The AgentSettings the flags describe."""
    from rlslice.config import TLSConfig
    from rlslice.snapshot_agent.settings import AgentSettings, SimSettings

    fields: dict[str, Any] = {}
    sim: dict[str, Any] = {}
    simple = {
        "node": "node",
        "address": "address",
        "advertise_address": "advertise_address",
        "socket": "socket_path",
        "state_dir": "state_dir",
        "backend": "backend",
        "scheduler": "scheduler",
    }
    for flag, field in simple.items():
        value = getattr(args, flag)
        if value:
            fields[field] = value
    fields.setdefault("address", "127.0.0.1:7071")
    if args.socket_mode:
        fields["socket_mode"] = int(args.socket_mode, 8)
    if args.host_reserve:
        fields["host_reserve_bytes"] = parse_size(args.host_reserve)
    if args.metrics_port:
        fields["metrics_port"] = int(args.metrics_port)
    if args.sim_devices:
        sim["devices"] = int(args.sim_devices)
    if args.sim_capacity:
        sim["capacity_bytes"] = parse_size(args.sim_capacity)
    if args.sim_rate_gbps:
        sim["rate_gbps"] = float(args.sim_rate_gbps)
    if args.sim_overhead_seconds:
        sim["overhead_seconds"] = float(args.sim_overhead_seconds)
    if args.sim_root:
        sim["root"] = Path(args.sim_root)
    fields["sim"] = SimSettings(**sim)
    token = args.token
    if not token and args.token_file:
        token = Path(args.token_file).read_text().strip()
    if token:
        fields["token"] = token
    if args.tls_cert or args.tls_key:
        fields["tls"] = TLSConfig(
            cert=args.tls_cert, key=args.tls_key, client_ca=args.tls_client_ca or None
        )
    if args.scheduler_ca:
        fields["scheduler_tls"] = TLSConfig(ca=args.scheduler_ca)
    labels = {}
    for item in args.label:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"rlslice agent: --label {item!r} is not key=value")
        labels[key] = value
    fields["labels"] = labels
    return AgentSettings(**fields)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import signal
    import sys

    from pydantic import ValidationError

    from rlslice._errors import RlsliceError
    from rlslice.snapshot_agent.agent import start_agent

    try:
        settings = settings_from(args)
    except (ValidationError, ValueError, OSError) as error:
        print(f"rlslice agent: {error}", file=sys.stderr)
        return 2

    async def main() -> int:
        try:
            agent = await start_agent(settings)
        except (RlsliceError, RuntimeError, OSError) as error:
            print(f"rlslice agent: {error}", file=sys.stderr)
            return 1
        print(
            f"rlslice agent: node {agent.node} serving on {agent.address}, "
            f"local socket {agent.socket_path}, backend {settings.backend}",
            flush=True,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
        await agent.stop(grace=5.0)
        return 0

    return asyncio.run(main())
