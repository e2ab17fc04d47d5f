"""Two real `trl.GRPOTrainer` jobs share one group through `rlslice up --backend app`.

Each job (tests/integrations/trl_job.py, a real process) builds a tiny Llama and tokenizer
offline and runs `GRPOTrainer` with `GpuPhaseCallback(offload=True)`, the two lines of the
TRL recipe. The pair runs alone first (no scheduler: the callback passes through), then
both at once on a group whose headroom no machine has, so every grant to the other job
moves state (the CPU case of docs/integrations.md).

Cases, in one run of the pair:
- each job's per-step losses, rewards and final weights are bit-identical to its run alone;
- state really moved: the group counted switches, the jobs' grants restored bytes, and
  every grant that says `restored` moved bytes;
- the end of training: each job left the group while holding it (no yield after its last
  grant, so nothing snapshotted it on the way out); after `train()` no parameter is empty,
  nothing is offloaded, and `trainer.save_model()` wrote the weights in memory;
- no switch failed, the longest grant wait stays below the agent's wait for a missing
  workload stream (the stall a leaving job caused before), and the grant after the first
  job left waited no longer than the grants before it (one second of slack).

A rollout/train split of the same pair (the group declares `rollout` and `train` phase
kinds): grpo-a holds its `rollout` phase for the whole run (`hold="train",
offer="asked"`), grpo-b holds a `train` phase per step. Once grpo-b's train waits, grpo-a
is asked to yield and gives the group up at its next step end (its first step end waits
for the request, so the case never depends on how fast steps run); grpo-a is granted again
once per early yield, grpo-b once per step, and both still compute bit-identically to their
runs alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")

import grpc

from rlslice.snapshot_agent.engine import WORKLOAD_ATTACH_SECONDS
from rlslice.testing import free_port
from rlslice.v1alpha1 import scheduler_pb2 as pb
from rlslice.v1alpha1 import scheduler_pb2_grpc

JOB = Path(__file__).with_name("trl_job.py")
GROUP = "trl-pair"
STEPS = 3
SEEDS = {"grpo-a": 1, "grpo-b": 2}
#: Keys of the trainer's log that measure wall time, not the computation.
TIMING = ("step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLSLICE_")}
    return env | {"PYTHONSAFEPATH": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"} | extra


@pytest.fixture
def up(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """`rlslice up --backend app` with the group of the recipe; (scheduler, agent socket)."""
    config = tmp_path / "groups.yaml"
    config.write_text(
        f"groups:\n  - name: {GROUP}\n    backend: app\n    headroom_bytes: {1 << 50}\n"
        "    phases: {rollout: {kind: rollout}, train: {kind: train}}\n"
    )
    address = f"127.0.0.1:{free_port()}"
    sock = tmp_path / "agent.sock"
    argv = [
        sys.executable, "-m", "rlslice.apps", "--log-level", "WARNING", "up",
        "--address", address, "--store", str(tmp_path / "scheduler.sqlite"),
        "--socket", str(sock), "--state-dir", str(tmp_path / "agent"),
        "--backend", "app", "--group-config", str(config), "--host-reserve-bytes", "0",
    ]  # fmt: skip
    log = (tmp_path / "up.log").open("wb")
    process = subprocess.Popen(argv, env=_env(), stdout=subprocess.PIPE, stderr=log)
    try:
        assert process.stdout is not None
        for raw in process.stdout:  # `rlslice up` prints its agent's line once both serve
            if raw.decode().startswith("agent "):
                break
        else:
            pytest.fail(f"rlslice up exited: {(tmp_path / 'up.log').read_text()}")
        yield address, str(sock)
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


#: The rollout/train split: grpo-a's callback holds a rollout across steps and yields when
#: asked; grpo-b's holds a train per step (the default).
SPLIT = {
    "grpo-a": [
        "--phase",
        "rollout",
        "--hold",
        "train",
        "--offer",
        "asked",
        "--await-yield-request",
    ],
    "grpo-b": ["--phase", "train"],
}


@pytest.fixture(scope="module")
def alone(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Both jobs without a scheduler (the callback passes through): the reference."""
    return _pair(tmp_path_factory.mktemp("alone"), "alone", _env())


def _pair(
    work: Path, label: str, env: dict[str, str], extra: dict[str, list[str]] | None = None
) -> dict[str, dict[str, Any]]:
    """Both jobs at once, their loops started together; their JSON by job."""
    barrier = work / f"barrier-{label}"
    barrier.mkdir()
    running = {}
    for job, seed in SEEDS.items():
        out = work / f"{job}-{label}.json"
        argv = [sys.executable, str(JOB), "--seed", str(seed), "--steps", str(STEPS)]
        argv += ["--out", str(out), "--barrier", str(barrier), "--job", job]
        argv += (extra or {}).get(job, [])
        log = (work / f"{job}-{label}.log").open("wb")
        running[job] = (
            out,
            log,
            subprocess.Popen(argv, env=env | {"RLSLICE_JOB": job}, stdout=log, stderr=log),
        )
    deadline = time.monotonic() + 120
    while not all((barrier / f"{job}.ready").exists() for job in SEEDS):
        for job, (_, _, process) in running.items():
            assert process.poll() is None, (work / f"{job}-{label}.log").read_text()
        assert time.monotonic() < deadline, "the jobs were not ready within 120 s"
        time.sleep(0.02)
    (barrier / "go").touch()
    results = {}
    for job, (out, log, process) in running.items():
        code = process.wait(timeout=120)
        log.close()
        assert code == 0, (work / f"{job}-{label}.log").read_text()[-4000:]
        results[job] = json.loads(out.read_text())
    return results


def _computed(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k not in TIMING} for row in history]


def test_two_grpo_trainers_share_a_group_bit_identically_and_keep_their_weights(
    up: tuple[str, str], tmp_path: Path, alone: dict[str, dict[str, Any]]
) -> None:
    address, agent_socket = up
    sliced = _pair(
        tmp_path,
        "sliced",
        _env(RLSLICE_SCHEDULER=address, RLSLICE_GROUP=GROUP, RLSLICE_AGENT_SOCKET=agent_socket),
    )
    with grpc.insecure_channel(address) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        status = stub.GetGroup(pb.GetGroupRequest(group=GROUP), timeout=10)
        events = stub.GetEvents(pb.GetEventsRequest(group=GROUP), timeout=10).events

    for job in SEEDS:
        a, s = alone[job], sliced[job]
        assert len(s["history"]) == STEPS
        assert _computed(s["history"]) == _computed(a["history"]), job
        assert s["weights_sha256"] == a["weights_sha256"], job
        # The end of training: the weights are home and saved as they are in memory.
        assert s["empty_parameters"] == [], job
        assert not s["offloaded_after_train"], job
        assert s["saved_matches"], job
        assert s["offloader_tags"] == ["weights", "optimizer"], job
        assert s["left_with"] == {"held": False, "grants": STEPS}, job
        assert all(not g["disabled"] for g in s["grants"]), job
        assert all(g["disabled"] for g in a["grants"]), job
        # `restored` only when bytes came back.
        assert all(g["moved_bytes"] > 0 for g in s["grants"] if g["restored"]), s["grants"]

    grants = [g for job in SEEDS for g in sliced[job]["grants"]]
    assert status.switches > 0
    assert sum(g["moved_bytes"] for g in grants) > 0
    assert any(g["restored"] for g in grants)

    kinds = pb.EventKind
    assert [e.detail for e in events if e.kind == kinds.EVENT_KIND_SWITCH_FAILED] == []
    for job in SEEDS:
        mine = [e.kind for e in events if e.job == job]
        last_grant = max(i for i, kind in enumerate(mine) if kind == kinds.EVENT_KIND_GRANTED)
        # Left while holding: no yield after the last grant, the lease ended by Unregister.
        assert kinds.EVENT_KIND_YIELDED not in mine[last_grant:], job
        assert mine[-1] == kinds.EVENT_KIND_UNREGISTERED, job
    longest = max(g["waited_seconds"] for g in grants)
    assert longest < WORKLOAD_ATTACH_SECONDS
    # The grant after the first job left waited about as long as the grants before it.
    left = min(i for i, e in enumerate(events) if e.kind == kinds.EVENT_KIND_UNREGISTERED)
    granted = [(i, e.seconds) for i, e in enumerate(events) if e.kind == kinds.EVENT_KIND_GRANTED]
    before = [wait for i, wait in granted if i < left]
    after = [wait for i, wait in granted if i > left]
    if after:  # the other job may have finished its steps first
        assert after[0] <= max(before) + 1.0, (before, after)
    print(
        f"switches={status.switches} moved_bytes={sum(g['moved_bytes'] for g in grants)} "
        f"longest_wait={longest:.3f}s waits_before_leave={[round(w, 3) for w in before]} "
        f"after_leave={[round(w, 3) for w in after]}"
    )


def test_a_rollout_trainer_yields_early_to_a_train_trainer_bit_identically(
    up: tuple[str, str], tmp_path: Path, alone: dict[str, dict[str, Any]]
) -> None:
    address, agent_socket = up
    env = _env(
        RLSLICE_SCHEDULER=address,
        RLSLICE_GROUP=GROUP,
        RLSLICE_AGENT_SOCKET=agent_socket,
        RLSLICE_LEASE_SECONDS="2",  # a keep-alive every 2/3 s: the request arrives soon
    )
    split = _pair(tmp_path, "split", env, SPLIT)
    with grpc.insecure_channel(address) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        events = stub.GetEvents(pb.GetEventsRequest(group=GROUP), timeout=10).events

    for job in SEEDS:
        a, s = alone[job], split[job]
        assert len(s["history"]) == STEPS, job
        assert _computed(s["history"]) == _computed(a["history"]), job
        assert s["weights_sha256"] == a["weights_sha256"], job
        assert s["empty_parameters"] == [], job
        assert s["saved_matches"], job
    rollout, train = split["grpo-a"], split["grpo-b"]
    assert rollout["early_yields"] >= 1
    # One grant for the run, one more after each early yield.
    assert rollout["left_with"]["grants"] == 1 + rollout["early_yields"]
    assert train["early_yields"] == 0
    assert train["left_with"]["grants"] == STEPS
    kinds = pb.EventKind
    granted = [(e.job, e.detail) for e in events if e.kind == kinds.EVENT_KIND_GRANTED]
    assert ("grpo-a", "rollout") in granted
    assert ("grpo-b", "train") in granted
    assert [e.detail for e in events if e.kind == kinds.EVENT_KIND_SWITCH_FAILED] == []
