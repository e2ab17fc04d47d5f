"""Site-wide mode under a real Slurm: `rlslice scheduler` and `rlslice agent` run on the node
as services (here: plain processes started beside the cluster, as systemd would), and each
Slurm job only calls `srun rlslice run -- python3 train.py`.

Cases:
- two Slurm jobs, each asking `--gres=gpu:1`, both complete; each is the rlslice job
  `slurm-<SLURM_JOB_ID>` in the group named after the node (defaults from the allocation,
  no --job or --group given); Slurm bound them to different GPUs and each one's emulated
  device memory sits on the device Slurm gave it (sim0 for one, sim1 for the other);
- they took turns: the node's group counted every grant of both jobs, and at least one
  grant waited for the other job.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlslice._nodes import node_label
from rlslice.testing import free_port

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "slurm"
CLI = [sys.executable, "-m", "rlslice.apps", "--log-level", "WARNING"]
STEPS = 3


def _wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out: {what}")


@pytest.fixture
def services(slurm: Any, tmp_path: Path) -> Iterator[dict[str, str]]:
    """A scheduler and this node's agent, as the systemd units run them; the variables a
    site sets for every job (RLSLICE_SCHEDULER, RLSLICE_AGENT_SOCKET, ...)."""
    group = node_label(slurm.node)
    token = tmp_path / "job.token"
    token.write_text("site-wide-job-token\n")
    token.chmod(0o600)
    groups = tmp_path / "groups.yaml"
    groups.write_text(f"groups:\n  - name: {group}\n    backend: sim\n    nodes: [{group}]\n")
    port, agent_port = free_port(), free_port()
    socket_path = tmp_path / "run" / "agent.sock"
    socket_path.parent.mkdir()
    env = {**slurm.env, "RLSLICE_JOB_TOKEN": "site-wide-job-token"}
    argvs = [
        [
            *CLI,
            "scheduler",
            "--address",
            f"127.0.0.1:{port}",
            "--store",
            str(tmp_path / "scheduler.sqlite"),
            "--group-config",
            str(groups),
        ],
        [
            *CLI[:-1],
            "INFO",  # its log says when it registered with the scheduler
            "agent",
            "--node",
            slurm.node,
            "--scheduler",
            f"127.0.0.1:{port}",
            "--address",
            f"127.0.0.1:{agent_port}",
            "--socket",
            str(socket_path),
            "--socket-mode",
            "666",
            "--state-dir",
            str(tmp_path / "agent"),
            "--sim-root",
            str(tmp_path / "sim"),
            "--sim-devices",
            "2",
            "--sim-capacity",
            "48MiB",
        ],
    ]
    logs = [open(tmp_path / f"service-{i}.log", "wb") for i in range(2)]  # noqa: SIM115
    processes = [
        subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        for argv, log in zip(argvs, logs, strict=True)
    ]
    try:
        _wait_for(socket_path.exists, 30, "the agent's socket")
        # Ready as a site's are when jobs arrive: the agent serves its socket before it has
        # registered with the scheduler, and a switch on a node no agent registered for
        # yet fails (the job's acquire is refused ABORTED).
        agent_log = tmp_path / "service-1.log"
        _wait_for(
            lambda: b"registered with scheduler" in agent_log.read_bytes(),
            30,
            "the agent's registration with the scheduler",
        )
        yield {
            "RLSLICE_SCHEDULER": f"127.0.0.1:{port}",
            "RLSLICE_TOKEN_FILE": str(token),
            "RLSLICE_AGENT_SOCKET": str(socket_path),
            "RLSLICE_SIM_ROOT": str(tmp_path / "sim"),
            "group": group,
        }
    finally:
        for process in reversed(processes):  # the agent first, as systemd would at shutdown
            process.terminate()
            process.wait(timeout=20)
        for log in logs:
            log.close()


def test_jobs_that_only_call_rlslice_run_share_the_nodes_gpus(
    slurm: Any, services: dict[str, str], tmp_path: Path
) -> None:
    site = {k: v for k, v in services.items() if k.startswith("RLSLICE_")}
    env = {**site, "TRAIN_STEPS": str(STEPS), "TRAIN_STATE_MIB": "16"}
    job_ids = [
        slurm.sbatch(
            "--gres=gpu:1",
            "--ntasks=1",
            f"--nodelist={slurm.node}",
            f"--chdir={EXAMPLE}",
            f"--output={tmp_path}/slurm-%j.out",
            "--wrap",
            "srun rlslice run --no-register -- python3 train.py",
            env=env,
        )
        for _ in range(2)
    ]
    outputs = {}
    for job_id in job_ids:
        fields = slurm.wait_done(job_id, timeout=90)
        outputs[job_id] = (tmp_path / f"slurm-{job_id}.out").read_text()
        assert fields["JobState"] == "COMPLETED", outputs[job_id]

    devices = set()
    waits = []
    for job_id, output in outputs.items():
        job = f"slurm-{job_id}"
        loaded = re.search(rf"^{job}: load on (sim\d)$", output, re.M)
        assert loaded, output
        devices.add(loaded.group(1))
        assert f"{job}: done, {STEPS} steps" in output
        waits += [float(w) for w in re.findall(r"grant waited (\d+\.\d+) s", output)]
    assert devices == {"sim0", "sim1"}, "each job's memory is on the GPU Slurm bound to it"
    assert len(waits) == 2 * 2 * STEPS
    assert max(waits) > 0.05, "the jobs never waited for each other"

    status = subprocess.run(
        [*CLI, "status", "--scheduler", services["RLSLICE_SCHEDULER"], "--json"],
        env={**os.environ, "PYTHONSAFEPATH": "1", "RLSLICE_TOKEN": "site-wide-job-token"},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    (group,) = json.loads(status.stdout)
    assert group["spec"]["name"] == services["group"]
    assert int(group["epoch"]) >= 2 * (1 + 2 * STEPS)
