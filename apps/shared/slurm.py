"""What a Slurm allocation says about the job it runs: pure functions over the environment.

Inside an allocation (`sbatch`, `salloc`, `srun`) Slurm sets `SLURM_JOB_ID`,
`SLURM_JOB_NODELIST` (a host list such as `gpu[01-03,07],login1`), `SLURMD_NODENAME` (this
node) and, with `--gres=gpu:N`, `CUDA_VISIBLE_DEVICES`. `rlslice run` takes its defaults from
them:

- job: `slurm-<SLURM_JOB_ID>` (every step of one allocation is one rlslice job);
- group: the allocation's nodes as one id: a single node's own id (`gpu01`), or for several
  nodes their sorted names joined with `+`, made a DNS-1123 label by `node_label` (a short
  hash keeps it unique), so two allocations on the same nodes name the same group;
- nodes of the group: every host of `SLURM_JOB_NODELIST`, each as `node_label` makes it,
  which is the id an agent started with `--node <Slurm node name>` registers under.

Nothing here reads a file or runs `scontrol`: the host list is expanded here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from rlslice._nodes import node_label

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(text: str) -> list[str]:
    """The host names of a Slurm host list, in order: `a[01-03],b` -> a01, a02, a03, b.

    Handles ranges and lists in brackets with zero padding, and several bracket groups in
    one name (`r[1-2]n[1-2]`); raises ValueError for an unbalanced or empty expression.
    """
    hosts: list[str] = []
    for item in _split_top_level(text.strip()):
        hosts.extend(_expand_one(item))
    return hosts


def _split_top_level(text: str) -> list[str]:
    items, depth, current = [], 0, ""
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"host list {text!r}: unbalanced ']'")
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    if depth:
        raise ValueError(f"host list {text!r}: unbalanced '['")
    items.append(current)
    if any(not item for item in items):
        raise ValueError(f"host list {text!r}: empty name")
    return items


def _expand_one(item: str) -> list[str]:
    start = item.find("[")
    if start < 0:
        return [item]
    end = item.index("]", start)
    prefix, body, rest = item[:start], item[start + 1 : end], item[end + 1 :]
    numbers: list[str] = []
    for part in body.split(","):
        match = _RANGE.fullmatch(part.strip())
        if match is None:
            raise ValueError(f"host list item {item!r}: {part!r} is not N or N-M")
        low, high = match.group(1), match.group(2) or match.group(1)
        width = len(low)
        if int(high) < int(low):
            raise ValueError(f"host list item {item!r}: range {part!r} runs backwards")
        numbers.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return [prefix + number + tail for number in numbers for tail in _expand_one(rest)]


def group_for_nodes(nodes: list[str]) -> str:
    """The default group id of an allocation on `nodes` (see the module doc)."""
    if not nodes:
        raise ValueError("nodes: an allocation has at least one node")
    if len(nodes) == 1:
        return node_label(nodes[0])
    return node_label("+".join(sorted(set(nodes))))


@dataclass(frozen=True)
class Allocation:
    """The parts of a Slurm allocation that name an rlslice job, its group and nodes."""

    job_id: str
    """`SLURM_JOB_ID`."""
    nodes: tuple[str, ...]
    """Host names of `SLURM_JOB_NODELIST`, in Slurm's order."""
    node: str | None
    """This node's Slurm name (`SLURMD_NODENAME`), when Slurm gave it."""

    @property
    def job(self) -> str:
        """Default job id: `slurm-<SLURM_JOB_ID>`."""
        return f"slurm-{self.job_id}"

    @property
    def group(self) -> str:
        """Default group id, from the nodes."""
        return group_for_nodes(list(self.nodes))

    @property
    def node_ids(self) -> tuple[str, ...]:
        """The nodes as agent ids (`node_label` of each)."""
        return tuple(node_label(node) for node in self.nodes)


def allocation_from(environ: Mapping[str, str]) -> Allocation | None:
    """The allocation the environment describes, or None outside Slurm."""
    job_id = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not job_id or not nodelist:
        return None
    return Allocation(
        job_id=job_id,
        nodes=tuple(expand_hostlist(nodelist)),
        node=environ.get("SLURMD_NODENAME") or None,
    )


def group_config_yaml(
    allocation: Allocation, *, group: str, backend: str, policy: str = "fifo"
) -> str:
    """A `--group-config` file for the scheduler: one group over the allocation's nodes."""
    nodes = ", ".join(allocation.node_ids)
    return (
        "groups:\n"
        f"  - name: {group}\n"
        f"    backend: {backend}\n"
        f"    policy: {policy}\n"
        f"    nodes: [{nodes}]\n"
    )
