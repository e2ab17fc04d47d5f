"""On a GPU node: which path a parked job's NCCL communicators get, and the rebuild path run.

    python examples/ddp_tiny/nccl_check.py [--json FILE]     # tools/gpu_check.sh runs it

1. Starts a one-rank NCCL process group on GPU 0 and runs an all_reduce (torch loads its
   libnccl: the one the job would use).
2. Prints `communicator_path` of that library: `suspend` (NCCL >= 2.29.7 exporting
   ncclCommSuspend/ncclCommResume) or `rebuild`, with the version it read through ctypes
   next to torch's own `torch.cuda.nccl.version()`.
3. Runs `CommunicatorOffloader`'s rebuild path for real: OFFLOAD destroys the process group
   (device memory before and after, from `torch.cuda.mem_get_info`), RESTORE creates it
   again, and an all_reduce on the new group gives the same answer.

Exits 0 when the group came back and the library's version agrees with torch's.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path
from typing import Any


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist

    from rlslice.client import CommunicatorOffloader, communicator_path
    from rlslice.client._communicators import load_nccl, nccl_version

    if not torch.cuda.is_available():
        print("nccl_check: no CUDA device", file=sys.stderr)
        return 2
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)

    def start() -> None:
        dist.init_process_group(
            "nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1,
            device_id=device,
        )  # fmt: skip

    def total() -> float:
        value = torch.ones(4, device=device)
        dist.all_reduce(value)
        torch.cuda.synchronize()
        return float(value.sum().item())

    start()
    before = total()
    library = load_nccl()
    path = communicator_path(library)
    report: dict[str, Any] = {
        "path": path.kind,
        "detail": path.detail,
        "ctypes_version": nccl_version(library) if library is not None else None,
        "torch_version": list(torch.cuda.nccl.version()),
    }
    free_up = torch.cuda.mem_get_info(device)[0]
    offloader = CommunicatorOffloader(
        destroy=dist.destroy_process_group, rebuild=start, library=_WithoutSuspend(library)
    )
    offloader.offload()
    torch.cuda.synchronize()
    free_down = torch.cuda.mem_get_info(device)[0]
    offloader.restore()
    after = total()
    report |= {
        "rebuilt": after == before,
        "freed_bytes_at_destroy": int(free_down - free_up),
        "all_reduce": [before, after],
    }
    major, minor, patch = report["torch_version"]
    agree = report["ctypes_version"] in (major * 10000 + minor * 100 + patch, None)
    report["versions_agree"] = agree
    dist.destroy_process_group()
    print(json.dumps(report, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))
    return 0 if report["rebuilt"] and agree else 1


class _WithoutSuspend:
    """The loaded library seen as one without ncclCommSuspend, so step 3 takes the rebuild
    path whatever this node's NCCL offers (the suspend path needs the raw ncclComm_t
    handles, which torch does not expose)."""

    def __init__(self, library: Any) -> None:
        self._library = library

    def ncclGetVersion(self, pointer: Any) -> int:  # NCCL's own name
        return int(self._library.ncclGetVersion(pointer)) if self._library is not None else 1


if __name__ == "__main__":
    sys.exit(main())
