"""`examples/slurm/two_node_group.sbatch` under a real Slurm on the `sim` backend: the script
brings up a scheduler and an agent per node inside the allocation and runs two RL jobs that
take turns on the group's GPUs.

Cases:
- one node, `--gres=gpu:2`: the allocation completes; both jobs finish their steps on both
  emulated GPUs Slurm bound, the scheduler counts switches between them and moved bytes, and
  some grant restored a parked job's state; afterwards the private directory, the runtime
  directory and every process of the allocation are gone;
- two nodes, `--gres=gpu:2` each: the group spans both nodes, each job runs a rank per node
  (rank 0 drives the others over torch.distributed), every switch moves the state on both
  nodes, and both jobs complete;
- while it runs, the tokens are private: files 0600 in a 0700 directory; another user
  (`nobody`) can neither read them nor list the directory nor reach the agent's socket; no
  process shows a token in its argv (world-readable), and every process whose environment
  holds one belongs to the job's user;
- `scancel` while a job is parked (its worker stopped, state T) ends the allocation with no
  process left, no stopped worker, and the tokens and runtime directory removed.
"""

from __future__ import annotations

import json
import os
import re
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "slurm"
SCRIPT = EXAMPLE / "two_node_group.sbatch"
STATE_MIB = 24
NOBODY = 65534


@pytest.fixture
def public(tmp_path: Path) -> Iterator[Path]:
    """A folder every user may enter (pytest's own are 0700), so that what stops `nobody`
    is the script's modes, not the folders above."""
    folder = Path(tempfile.mkdtemp(prefix="rlslice-slurm-test-", dir="/tmp"))
    folder.chmod(0o755)
    (folder / "control.txt").write_text("readable\n")
    (folder / "control.txt").chmod(0o644)
    yield folder
    import shutil

    shutil.rmtree(folder, ignore_errors=True)


def _submit(
    slurm: Any, tmp_path: Path, public: Path, steps: int, nodes: int = 1
) -> tuple[str, Path, Path]:
    state = public / "state"
    report = tmp_path / "report"
    where = {
        1: ["--nodes=1", f"--nodelist={slurm.node}", "--gres=gpu:2"],
        2: ["--nodes=2", "--gres=gpu:2"],
    }[nodes]
    # Two nodes on one host: everything on loopback, the ranks' gloo too.
    loopback = {
        "RLSLICE_BIND": "127.0.0.1",
        "RLSLICE_HEAD_ADDRESS": "127.0.0.1",
        "MASTER_ADDR": "127.0.0.1",
        "GLOO_SOCKET_IFNAME": "lo",
    }
    job_id = slurm.sbatch(
        *where,
        f"--chdir={EXAMPLE}",
        f"--output={tmp_path}/slurm-%j.out",
        str(SCRIPT),
        env={
            "RLSLICE_BACKEND": "sim",
            "RLSLICE_STATE": str(state),
            "RLSLICE_REPORT": str(report),
            "RLSLICE_SIM_CAPACITY": f"{STATE_MIB * 3 // 2}MiB",  # one job's state per GPU
            # More headroom than a GPU holds: every switch parks the other job, whatever the
            # order the jobs load in (co-residency is the scheduler's own tests' business).
            "RLSLICE_HEADROOM_BYTES": str(1 << 40),
            "TRAIN_STEPS": str(steps),
            "TRAIN_STATE_MIB": str(STATE_MIB),
            **(loopback if nodes > 1 else {}),
        },
    )
    return job_id, state, report


def _output(tmp_path: Path, job_id: str) -> str:
    path = tmp_path / f"slurm-{job_id}.out"
    return path.read_text() if path.exists() else ""


def _wait_done(slurm: Any, job_id: str, tmp_path: Path, timeout: float) -> dict[str, str]:
    try:
        fields: dict[str, str] = slurm.wait_done(job_id, timeout)
    except AssertionError as error:
        raise AssertionError(f"{error}; its output:\n{_output(tmp_path, job_id)}") from None
    return fields


def _poll(condition: object, timeout: float, what: str) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out: {what}")


def _as_nobody(paths: list[Path], folder: Path, sock: Path) -> list[str]:
    """What user `nobody` gets through to, tried in a forked child that drops to that user."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no exec, only the calls being checked
        got = []
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            for path in paths:
                try:
                    path.read_bytes()
                    got.append(f"read {path.name}")
                except PermissionError:
                    pass
            try:
                os.listdir(folder)
                got.append("listed")
            except PermissionError:
                pass
            with socket.socket(socket.AF_UNIX) as s:
                try:
                    s.connect(str(sock))
                    got.append("connected")
                except PermissionError:
                    pass
            os.write(write_end, json.dumps(got).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as answer:
        data = answer.read()
    os.waitpid(pid, 0)
    assert data, "the probe as nobody died"
    result: list[str] = json.loads(data)
    return result


def _check_tokens_private(slurm: Any, state: Path, run_dir: Path, job_id: str) -> None:
    node_dir = run_dir / slurm.node
    assert state.stat().st_mode & 0o777 == 0o700
    tokens = {}
    for role in ("job", "admin", "agent"):
        path = state / f"{role}.token"
        assert path.stat().st_mode & 0o777 == 0o600, path
        tokens[role] = path.read_text().strip().encode()
        assert len(tokens[role]) >= 32
    assert run_dir.stat().st_mode & 0o777 == 0o700
    assert node_dir.stat().st_mode & 0o777 == 0o700

    control = state.parent / "control.txt"
    got = _as_nobody(
        [control, state / "job.token", state / "admin.token"], state, node_dir / "agent.sock"
    )
    assert got == ["read control.txt"], f"nobody got through: {got}"

    job_pids = {p.pid for p in slurm.of_job(job_id)}
    assert job_pids, "no process of the allocation found"
    for proc in slurm.processes():
        for role, token in tokens.items():
            assert token not in proc.argv, f"{role} token in the argv of pid {proc.pid}"
            if token in proc.environ:
                owner = Path(f"/proc/{proc.pid}").stat().st_uid
                assert owner == 0, (role, proc.pid)
                assert proc.pid in job_pids, (role, proc.pid)


def _metric(text: str, name: str) -> float:
    values = re.findall(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M)
    return sum(float(v) for v in values)


def test_the_example_time_slices_two_jobs_and_leaves_nothing_behind(
    slurm: Any, tmp_path: Path, public: Path
) -> None:
    started = time.monotonic()
    job_id, state, report = _submit(slurm, tmp_path, public, steps=3)
    run_dir = Path(f"/tmp/rlslice-slurm-{job_id}")
    _poll(lambda: "load on" in _output(tmp_path, job_id), 60, "a job loaded")
    _check_tokens_private(slurm, state, run_dir, job_id)

    fields = _wait_done(slurm, job_id, tmp_path, timeout=90)
    elapsed = time.monotonic() - started
    output = _output(tmp_path, job_id)
    assert fields["JobState"] == "COMPLETED", output
    assert fields["ExitCode"] == "0:0", output
    for job in ("grpo-a", "grpo-b"):
        assert f"{job}: load on sim0, sim1" in output
        assert f"{job}: done, 3 steps" in output

    (group,) = json.loads(Path(f"{report}.status.json").read_text())
    metrics = Path(f"{report}.metrics.txt").read_text()
    switches = int(group.get("switches", 0))
    moved = _metric(metrics, "rlslice_scheduler_moved_bytes_total")
    restored = re.findall(r"restored True moved (\d+) bytes", output)
    print(
        f"\nslurm round: {switches} switches, {moved / 2**20:.0f} MiB moved, "
        f"{elapsed:.1f} s from sbatch to both jobs done"
    )
    assert switches >= 2, group
    # Each switch parks one job's state on both GPUs and brings the other's back.
    assert moved >= 2 * switches * 2 * STATE_MIB * 2**20 * 0.5, (moved, switches)
    assert restored
    assert max(int(b) for b in restored) >= 2 * STATE_MIB * 2**20

    assert not state.exists(), "the tokens outlived the allocation"
    _poll(lambda: not slurm.of_job(job_id), 30, "the allocation's processes to end")
    assert not run_dir.exists()


def test_scancel_while_a_job_is_parked_leaves_no_process_and_no_frozen_worker(
    slurm: Any, tmp_path: Path, public: Path
) -> None:
    job_id, state, _ = _submit(slurm, tmp_path, public, steps=200)
    run_dir = Path(f"/tmp/rlslice-slurm-{job_id}")
    _poll(
        lambda: any(p.state == "T" for p in slurm.of_job(job_id)),
        60,
        "a parked (stopped) worker",
    )
    slurm.run("scancel", job_id)

    fields = _wait_done(slurm, job_id, tmp_path, timeout=60)
    assert fields["JobState"] == "CANCELLED"
    _poll(lambda: not slurm.of_job(job_id), 30, "no process of the allocation left")
    marker = str(run_dir).encode()
    assert not [p.pid for p in slurm.processes() if p.state == "T" and marker in p.environ]
    _poll(lambda: not state.exists() and not run_dir.exists(), 30, "the private files removed")


def test_two_nodes_make_one_group_and_every_switch_moves_state_on_both(
    slurm: Any, tmp_path: Path, public: Path
) -> None:
    started = time.monotonic()
    job_id, state, report = _submit(slurm, tmp_path, public, steps=2, nodes=2)
    fields = _wait_done(slurm, job_id, tmp_path, timeout=100)
    elapsed = time.monotonic() - started
    output = _output(tmp_path, job_id)
    assert fields["JobState"] == "COMPLETED", output
    assert fields["NodeList"] == "rl[1-2]"
    for job in ("grpo-a", "grpo-b"):
        assert f"{job}: done, 2 steps" in output

    (group,) = json.loads(Path(f"{report}.status.json").read_text())
    assert group["spec"]["nodes"] == list(slurm.nodes)
    switches = int(group.get("switches", 0))
    moved = _metric(
        Path(f"{report}.metrics.txt").read_text(), "rlslice_scheduler_moved_bytes_total"
    )
    print(f"\ntwo nodes: {switches} switches, {moved / 2**20:.0f} MiB moved, {elapsed:.1f} s")
    assert switches >= 2, group
    restored = [int(b) for b in re.findall(r"restored True moved (\d+) bytes", output)]
    # A restore brings one job's state back on both GPUs of both nodes.
    assert restored
    assert max(restored) >= 2 * 2 * STATE_MIB * 2**20
    assert not state.exists()
    _poll(lambda: not slurm.of_job(job_id), 30, "the allocation's processes to end")
