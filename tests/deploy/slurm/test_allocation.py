"""What `rlslice run` takes from a Slurm allocation, and how the `sim` backend's devices
follow Slurm's `--gres` binding; no Slurm needed (the environment is Slurm's interface).

Cases:
- host lists expand as `scontrol show hostnames` does: single names, ranges with zero
  padding, lists in brackets, several bracket groups, commas at the top level only;
  malformed ones are refused with the item named;
- the default group: one node's own id; several nodes' id the same whatever their order,
  different for different node sets, always a DNS-1123 label;
- outside an allocation there are no Slurm defaults;
- `rlslice run --print-group-config` prints a group config the scheduler loads, over the
  allocation's nodes as agent ids; outside an allocation it exits 2;
- `rlslice run --no-register` in an allocation gives the command job `slurm-<id>`, the
  nodes' group and this node's Slurm name as RLSLICE_NODE, and passes
  CUDA_VISIBLE_DEVICES through;
- `sim.attach(i)` counts the devices CUDA_VISIBLE_DEVICES lists (i=0 under "1" is the
  node's device 1; i=1 under "2,3" is device 3), refuses an index beyond the list, and
  counts as given when the variable is unset.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlslice._ids import is_valid_id
from rlslice.apps.shared.slurm import allocation_from, expand_hostlist, group_for_nodes
from rlslice.client import sim
from rlslice.config import load_group_config
from rlslice.snapshot_agent.backends import _simfs

CLI = [sys.executable, "-m", "rlslice.apps", "--log-level", "WARNING"]


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("node1", ["node1"]),
        ("gpu[01-03]", ["gpu01", "gpu02", "gpu03"]),
        ("gpu[1,3-4],login", ["gpu1", "gpu3", "gpu4", "login"]),
        ("r[1-2]n[8-9]", ["r1n8", "r1n9", "r2n8", "r2n9"]),
        ("a.example.org,b[9-10].x", ["a.example.org", "b9.x", "b10.x"]),
    ],
)
def test_host_lists_expand_like_scontrol(text: str, hosts: list[str]) -> None:
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["gpu[1-2", "gpu1-2]", "gpu[a-b]", "gpu[3-1]", "a,,b"])
def test_a_malformed_host_list_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="host list"):
        expand_hostlist(text)


def test_the_default_group_is_named_after_the_nodes() -> None:
    assert group_for_nodes(["gpu01"]) == "gpu01"
    pair = group_for_nodes(["gpu02", "gpu01"])
    assert pair == group_for_nodes(["gpu01", "gpu02"])
    assert pair != group_for_nodes(["gpu01", "gpu03"])
    assert pair.startswith("gpu01-gpu02-")
    assert is_valid_id(pair)
    assert is_valid_id(group_for_nodes([f"node{i}.cluster.example.org" for i in range(40)]))


def test_outside_an_allocation_there_are_no_slurm_defaults() -> None:
    assert allocation_from({"SLURM_JOB_ID": "7"}) is None
    allocation = allocation_from({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "g[1-2]"})
    assert allocation is not None
    assert (allocation.job, allocation.group) == ("slurm-7", group_for_nodes(["g1", "g2"]))


def _slurm_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "RLSLICE"))}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return {**env, "PYTHONSAFEPATH": "1", **extra}


def test_print_group_config_gives_the_scheduler_one_group_over_the_allocation(
    tmp_path: Path,
) -> None:
    env = _slurm_env(SLURM_JOB_ID="42", SLURM_JOB_NODELIST="gpu[07-08],dgx.rack1")
    done = subprocess.run(
        [*CLI, "run", "--print-group-config", "--backend", "cuda"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    path = tmp_path / "groups.yaml"
    path.write_text(done.stdout)
    (spec,) = load_group_config(path)
    assert spec.name == group_for_nodes(["gpu07", "gpu08", "dgx.rack1"])
    assert spec.backend == "cuda"
    assert spec.nodes[:2] == ("gpu07", "gpu08")
    assert spec.nodes[2].startswith("dgx-rack1-")

    outside = subprocess.run(
        [*CLI, "run", "--print-group-config"],
        env=_slurm_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert outside.returncode == 2
    assert "needs a Slurm allocation" in outside.stderr


def test_run_in_an_allocation_names_job_group_and_node_from_it() -> None:
    env = _slurm_env(
        SLURM_JOB_ID="42",
        SLURM_JOB_NODELIST="gpu[07-08]",
        SLURMD_NODENAME="gpu08",
        CUDA_VISIBLE_DEVICES="1",
    )
    show = "import json, os; print(json.dumps({k: v for k, v in os.environ.items()}))"
    done = subprocess.run(
        [*CLI, "run", "--no-register", "--", sys.executable, "-c", show],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    seen = json.loads(done.stdout)
    assert seen["RLSLICE_JOB"] == "slurm-42"
    assert seen["RLSLICE_GROUP"] == group_for_nodes(["gpu07", "gpu08"])
    assert seen["RLSLICE_NODE"] == "gpu08"
    assert seen["CUDA_VISIBLE_DEVICES"] == "1"
    assert "RLSLICE_AGENT_REGISTERED" not in seen


@pytest.fixture
def node_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "node"
    _simfs.write_devices(folder, [_simfs.SimFsDevice(i, 1 << 20, f"sim{i}") for i in range(4)])
    return folder


@pytest.mark.parametrize(
    ("visible", "index", "device"),
    [(None, 2, 2), ("1", 0, 1), ("2,3", 1, 3), ("3,0", 1, 0)],
)
def test_sim_devices_follow_cuda_visible_devices(
    node_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    visible: str | None,
    index: int,
    device: int,
) -> None:
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    attached = sim.attach(index, job="slurm-1", node_dir=node_dir)
    assert (attached.index, attached.name) == (device, f"sim{device}")


def test_a_device_beyond_cuda_visible_devices_is_refused(
    node_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES=1"):
        sim.attach(1, job="slurm-1", node_dir=node_dir)
