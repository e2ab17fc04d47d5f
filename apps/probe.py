"""`rlslice probe`: which backends can work on this node, and why the others cannot.

Each installed backend (entry-point group `rlslice.backends`) is created with a throwaway
state folder (and, for `sim`, throwaway emulated devices) and asked `probe()`; nothing is
moved and no agent needs to run. The `communicators` line says what a parked job's NCCL
communicators get here: `suspend` (NCCL >= 2.29.7 with ncclCommSuspend/ncclCommResume),
`rebuild` (older NCCL: destroyed and rebuilt) or `none` (no libnccl: gloo).
"""

from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--node", default=None, help="node name to probe as (default: host name)")


def run(args: argparse.Namespace) -> int:
    import asyncio
    import json
    import tempfile
    from pathlib import Path

    from rlslice.snapshot_agent.backends import installed_backends
    from rlslice.snapshot_agent.backends.base import BackendContext, ProbeResult
    from rlslice.snapshot_agent.settings import AgentSettings

    async def probe_all(state_dir: Path) -> list[tuple[str, ProbeResult]]:
        fields = {"node": args.node} if args.node else {}
        settings = AgentSettings(state_dir=state_dir, **fields)
        results = []
        for name, entry in installed_backends().items():
            if entry.cls is None:
                results.append((name, ProbeResult(False, f"cannot load: {entry.error}")))
                continue
            options = settings.options_for(name)
            if name == "sim":
                # Probe emulated devices of our own: never rewrite a running agent's table.
                options["root"] = str(state_dir / "sim-root")
            context = BackendContext(
                node=settings.node, state_dir=state_dir / name, options=options
            )
            context.state_dir.mkdir(parents=True, exist_ok=True)
            try:
                result = await entry.cls(context).probe()
            except Exception as error:
                result = ProbeResult(False, f"failed to start: {type(error).__name__}: {error}")
            results.append((name, result))
        return results

    from rlslice.client import communicator_path
    from rlslice.client._communicators import load_nccl

    with tempfile.TemporaryDirectory(prefix="rlslice-probe-") as folder:
        results = asyncio.run(probe_all(Path(folder)))
    # What a parked job's NCCL communicators get on this node (suspend, rebuild, none).
    comms = communicator_path(load_nccl())
    if args.json:
        report: dict[str, dict[str, object]] = {
            name: {"usable": r.usable, "detail": r.detail} for name, r in results
        }
        report["communicators"] = {"usable": True, "path": comms.kind, "detail": comms.detail}
        print(json.dumps(report, sort_keys=True))
    else:
        width = max((len(name) for name, _ in results), default=7)
        width = max(width, len("communicators"))
        for name, result in results:
            mark = "usable" if result.usable else "no"
            print(f"{name:<{width}}  {mark:<6}  {result.detail}")
        print(f"{'communicators':<{width}}  {comms.kind:<6}  {comms.detail}")
    return 0 if any(r.usable for _, r in results) else 1
