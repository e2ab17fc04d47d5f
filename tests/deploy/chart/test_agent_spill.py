"""The chart's disk tier values (`agent.spillDir`, `agent.hostBudget`), with real helm.

Case matrix:
- defaults: no spill volume, no RLSLICE_AGENT_SPILL_DIR or RLSLICE_AGENT_HOST_BUDGET;
- both set: the agent gets the budget and a spill directory that is the node's hostPath,
  mounted where the variable points;
- the schema refuses a relative spillDir and a hostBudget that is not a size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .conftest import CHART, RELEASE, env_of, find, render, run_helm


def agent(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return find(objects, "DaemonSet", "agent")


def test_by_default_the_agent_has_no_disk_tier(default_objects: list[dict[str, Any]]) -> None:
    daemonset = agent(default_objects)
    env = env_of(daemonset)
    assert "RLSLICE_AGENT_SPILL_DIR" not in env
    assert "RLSLICE_AGENT_HOST_BUDGET" not in env
    volumes = {v["name"] for v in daemonset["spec"]["template"]["spec"]["volumes"]}
    assert "spill" not in volumes


def test_a_spill_dir_is_the_nodes_hostpath_mounted_where_the_agent_looks(helm: Path) -> None:
    objects = render(helm, sets=["agent.spillDir=/mnt/nvme/rlslice", "agent.hostBudget=64GiB"])
    daemonset = agent(objects)
    env = env_of(daemonset)
    assert env["RLSLICE_AGENT_HOST_BUDGET"] == "64GiB"
    pod = daemonset["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "spill"]
    assert volume["hostPath"] == {"path": "/mnt/nvme/rlslice", "type": "DirectoryOrCreate"}
    (container,) = [c for c in pod["containers"] if c["name"] == "agent"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "spill"]
    assert mount["mountPath"] == env["RLSLICE_AGENT_SPILL_DIR"]


def test_the_schema_refuses_a_relative_spill_dir_and_a_budget_that_is_no_size(
    helm: Path,
) -> None:
    for bad in ("agent.spillDir=relative/dir", "agent.hostBudget=lots"):
        result = run_helm(helm, "template", RELEASE, str(CHART), "--set", bad)
        assert result.returncode != 0, bad
        assert "schema" in result.stderr.lower(), result.stderr
