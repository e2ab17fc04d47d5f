"""Jobs of many ranks on the client side: `Ranks`, `RankedClient`, the communicators' path.

Cases:
- ranks come from torch.distributed when initialised, else from RANK/WORLD_SIZE/LOCAL_RANK,
  else one rank; `RLSLICE_RANKS=one` wins over both (Slurm sets rank variables for
  unrelated steps); half-set or out-of-range variables are refused naming the variable;
- the communicators' path: no libnccl -> none; NCCL >= 2.29.7 exporting
  ncclCommSuspend/ncclCommResume -> suspend; older, or lacking a symbol -> rebuild (stand-in
  library objects at the ctypes boundary); the offloader suspends and resumes every
  communicator once per move, and runs the job's destroy/rebuild on the rebuild path;
- two real ranks (processes joined by gloo) against a real scheduler: only rank 0 talks to
  it (rank 1 is given an address where none listens), every phase is entered by both ranks
  on the one grant rank 0 got (same epochs), the all_reduce inside each phase sees both.

torch is required: with RLSLICE_REQUIRE_TORCH=1 (CI) a missing torch fails instead of skipping.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rlslice._errors import FailedPreconditionError, InvalidArgumentError
from rlslice.client import CommunicatorOffloader, Ranks, communicator_path, detect_ranks
from rlslice.client._ranks import ranks_from
from rlslice.testing import TestScheduler, free_port

RANKJOB = Path(__file__).with_name("rankjob.py")


@pytest.mark.parametrize(
    ("env", "distributed", "expected"),
    [
        ({}, None, Ranks()),
        ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}, None, Ranks(1, 4, 1, "env")),
        ({"RANK": "3", "WORLD_SIZE": "4"}, None, Ranks(3, 4, 3, "env")),
        ({"RANK": "9", "WORLD_SIZE": "99"}, (2, 8), Ranks(2, 8, 2, "torch.distributed")),
        ({"RANK": "1", "WORLD_SIZE": "2", "RLSLICE_RANKS": "one"}, None, Ranks(source="opt-out")),
        ({"RLSLICE_RANKS": "one"}, (1, 2), Ranks(source="opt-out")),
    ],
)
def test_ranks_come_from_torch_then_the_launchers_variables_unless_opted_out(
    env: dict[str, str], distributed: tuple[int, int] | None, expected: Ranks
) -> None:
    assert ranks_from(env, distributed) == expected


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"RANK": "1"}, "WORLD_SIZE"),
        ({"WORLD_SIZE": "2"}, "RANK"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE"),
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK"),
        ({"RLSLICE_RANKS": "all"}, "RLSLICE_RANKS"),
    ],
)
def test_rank_variables_that_do_not_make_sense_are_refused_naming_the_variable(
    env: dict[str, str], named: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=named):
        ranks_from(env)


def test_a_process_with_no_rank_variables_and_no_torch_group_is_one_leading_rank() -> None:
    ranks = detect_ranks({})
    assert ranks.single
    assert ranks.leader


class FakeNccl:
    """A stand-in for libnccl through ctypes: the version and the symbols it exports."""

    def __init__(self, version: int, symbols: tuple[str, ...]) -> None:
        self.version = version
        self.symbols = symbols
        self.calls: list[tuple[str, int]] = []

    def ncclGetVersion(self, pointer: Any) -> int:
        pointer._obj.value = self.version
        return 0

    def __getattr__(self, name: str) -> Any:
        if name not in self.symbols:
            raise AttributeError(name)

        def call(comm: ctypes.c_void_p, *args: object) -> int:
            self.calls.append((name, int(comm.value or 0)))
            return 0

        return call


@pytest.mark.parametrize(
    ("library", "kind", "detail"),
    [
        (None, "none", "no libnccl"),
        (FakeNccl(22907, ("ncclCommSuspend", "ncclCommResume")), "suspend", "NCCL 2.29.7"),
        (FakeNccl(23001, ("ncclCommSuspend", "ncclCommResume")), "suspend", "NCCL 2.30.1"),
        (FakeNccl(22906, ("ncclCommSuspend", "ncclCommResume")), "rebuild", "older than 2.29.7"),
        (FakeNccl(22907, ("ncclCommResume",)), "rebuild", "lacks ncclCommSuspend"),
        (FakeNccl(22103, ()), "rebuild", "NCCL 2.21.3 lacks"),
    ],
)
def test_the_communicators_path_is_told_by_the_version_and_the_exported_symbols(
    library: FakeNccl | None, kind: str, detail: str
) -> None:
    path = communicator_path(library)
    assert path.kind == kind
    assert detail in path.detail


def test_the_suspend_path_suspends_each_communicator_once_and_resumes_it() -> None:
    library = FakeNccl(22907, ("ncclCommSuspend", "ncclCommResume"))
    offloader = CommunicatorOffloader([0x10, 0x20], library=library)
    offloader.offload()
    offloader.offload()  # repeated: the agent may resend a command; nothing twice
    offloader.restore()
    offloader.restore()
    assert library.calls == [
        ("ncclCommSuspend", 0x10),
        ("ncclCommSuspend", 0x20),
        ("ncclCommResume", 0x10),
        ("ncclCommResume", 0x20),
    ]


def test_the_rebuild_path_runs_the_jobs_destroy_at_offload_and_rebuild_at_restore() -> None:
    events: list[str] = []
    offloader = CommunicatorOffloader(
        [0x10],
        library=FakeNccl(22600, ()),
        destroy=lambda: events.append("destroy"),
        rebuild=lambda: events.append("rebuild"),
    )
    assert offloader.path.kind == "rebuild"
    offloader.offload()
    offloader.restore()
    assert events == ["destroy", "rebuild"]


def test_the_rebuild_path_refuses_a_destroy_without_its_rebuild() -> None:
    with pytest.raises(FailedPreconditionError, match="both destroy and rebuild"):
        CommunicatorOffloader(library=FakeNccl(22600, ()), destroy=lambda: None)


def start_ranks(
    scheduler: str, job: str, world: int, steps: int, others: str | None = None, **extra: str
) -> list[subprocess.Popen[str]]:
    """`world` rank processes of `job` (rankjob.py), joined by gloo, torchrun-style; ranks
    other than 0 are given the scheduler address `others` when set."""
    port = str(free_port())
    processes = []
    for rank in range(world):
        env = {
            **os.environ,
            "PYTHONSAFEPATH": "1",
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            **extra,
        }
        address = scheduler if rank == 0 or others is None else others
        argv = [sys.executable, str(RANKJOB), address, job, "gpus", str(steps)]
        processes.append(
            subprocess.Popen(
                argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    return processes


def results(processes: list[subprocess.Popen[str]], timeout: float = 90.0) -> list[dict[str, Any]]:
    """Each rank's last JSON line, in rank order."""
    answers = []
    for process in processes:
        out, err = process.communicate(timeout=timeout)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        assert lines, f"rank exited {process.returncode} without an answer:\n{err[-3000:]}"
        answers.append(json.loads(lines[-1]))
    return answers


@pytest.fixture
def need_torch() -> None:
    if os.environ.get("RLSLICE_REQUIRE_TORCH") == "1":
        import torch  # noqa: F401
    else:
        pytest.importorskip("torch")


async def test_two_ranks_enter_every_phase_on_the_one_grant_rank_zero_asked_for(
    sched: TestScheduler, need_torch: None
) -> None:
    import asyncio

    # Rank 1 is given an address where no scheduler listens: it never calls one.
    processes = start_ranks(sched.address, "ddp-one", world=2, steps=3, others="127.0.0.1:9")
    answers = await asyncio.to_thread(results, processes)
    assert [a.get("error") for a in answers] == [None, None], answers
    first, second = answers
    assert first["source"] == second["source"] == "torch.distributed"
    assert first["epochs"] == second["epochs"]
    assert len(first["epochs"]) == 3
    assert all(epoch > 0 for epoch in first["epochs"])
    assert first["totals"] == second["totals"] == [3.0, 3.0, 3.0]  # both ranks were in
    assert (await sched.group("gpus")).holder == ""  # rank 0 gave the group back
