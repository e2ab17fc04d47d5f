"""One rank of a job for the ranked-client tests (run as a script, never imported).

    RANK=R WORLD_SIZE=N MASTER_ADDR=127.0.0.1 MASTER_PORT=P rankjob.py SCHEDULER JOB GROUP STEPS

Joins a gloo group, builds a `RankedClient` (quiesce deadline `$QUIESCE_SECONDS`, default
30), and runs STEPS phases named "train", each with an all_reduce inside. With
`STALL_RANK=R` and `STALL_SECONDS=S`, rank R stays S seconds in its first phase (it never
quiesces in time). Prints one JSON line at the end: the grants' epochs, or the error.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist

from rlslice.client import RankedClient


def main() -> int:
    scheduler, job, group, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    stall = int(os.environ.get("STALL_RANK", "-1"))
    stall_seconds = float(os.environ.get("STALL_SECONDS", "0"))
    epochs: list[int] = []
    totals: list[float] = []
    client = RankedClient(
        job=job,
        group=group,
        scheduler=scheduler,
        quiesce_seconds=float(os.environ.get("QUIESCE_SECONDS", "30")),
        lease_seconds=30.0,
    )
    try:
        for step in range(steps):
            with client.phase("train") as grant:
                value = torch.tensor([float(rank + 1)])
                dist.all_reduce(value)
                totals.append(float(value.item()))
                epochs.append(grant.epoch if grant is not None else -1)
                if rank == stall and step == 0:
                    time.sleep(stall_seconds)
    except Exception as error:
        print(json.dumps({"rank": rank, "error": type(error).__name__, "message": str(error)}))
        sys.stdout.flush()
        client.close()
        os._exit(3)  # the process group is broken: do not wait on it at exit
    client.close()
    print(
        json.dumps(
            {"rank": rank, "epochs": epochs, "totals": totals, "source": client.ranks.source}
        )
    )
    sys.stdout.flush()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
