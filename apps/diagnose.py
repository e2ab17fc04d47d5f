"""`rlslice diagnose SOURCE`: hypotheses per group from a scheduler's metrics.

SOURCE is the scheduler's metrics URL (http://host:port/metrics) or a saved text file.
"""

from __future__ import annotations

import argparse
import json


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="SOURCE", help="metrics URL or saved metrics file")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds for a URL")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _read(source: str, timeout: float) -> str:
    if source.startswith(("http://", "https://")):
        import urllib.request

        with urllib.request.urlopen(source, timeout=timeout) as response:
            body: bytes = response.read()
            return body.decode("utf-8")
    with open(source, encoding="utf-8") as handle:
        return handle.read()


def run(args: argparse.Namespace) -> int:
    from rlslice._errors import InvalidArgumentError
    from rlslice.planner.scheduler_metrics import ALL_GROUPS, diagnose_scheduler_metrics

    try:
        hypotheses = diagnose_scheduler_metrics(_read(args.source, args.timeout))
    except (InvalidArgumentError, OSError, UnicodeDecodeError) as error:
        print(f"rlslice diagnose: {error}")
        return 2
    if not hypotheses:
        print("rlslice diagnose: no rlslice_scheduler_* metrics in the source")
        return 2
    if args.json:
        print(json.dumps(hypotheses, indent=2))
        return 0
    for group, lines in hypotheses.items():
        print("scheduler-wide:" if group == ALL_GROUPS else f"group {group}:")
        for line in lines:
            print(f"  - {line}")
    return 0
