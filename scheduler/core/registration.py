"""Jobs no agent of their group knows: "lock only". Pure: plain data in, a verdict out.

A group with agents moves a job's state through the agent of each node where the job's
processes registered (`rlslice run`, the client with `RLSLICE_AGENT_SOCKET`, or the
`app` backend's offload loop). A job that registers with the scheduler while no agent of
its group knows it takes turns on the lock, but nothing of it moves: its device memory
stays where it is and nobody parks it for the others, while its grants look like any
other. At Register the scheduler asks the group's agents (`Status`) and judges here: such
a job is refused when the group sets `require_agent_registration`, else warned (the
RegisterResponse's `warning`, a log line, a metric) and shown as lock only in the group's
status. A group without agents is a pure lock by design: nothing to warn about. A node
that did not answer may know the job: no verdict then.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["AgentSurvey", "RegistrationVerdict", "judge"]


@dataclass(frozen=True, slots=True)
class AgentSurvey:
    """What one Status call to each of a group's nodes told, for a registration: who
    knows the job (the lock-only verdict) and where its state could be parked (the
    capacity rule, `core.capacity`). Nodes that did not answer are left out of `jobs`."""

    jobs: Mapping[str, Iterable[tuple[str, str]]] = field(default_factory=dict)
    """For each node that answered, its jobs as (job, group) pairs."""
    parking: Mapping[str, int] = field(default_factory=dict)
    """Host bytes each node whose host memory is known can give the group's parked state."""


@dataclass(frozen=True, slots=True)
class RegistrationVerdict:
    """What the group's agents said about one registering job."""

    job: str
    group: str
    nodes: tuple[str, ...]
    """The group's nodes, sorted."""
    knowing: tuple[str, ...] = ()
    """Nodes whose agent knows the job (in this group)."""
    silent: tuple[str, ...] = ()
    """Nodes that did not answer."""

    @property
    def lock_only(self) -> bool:
        """No agent of a group with agents knows the job, and every one of them answered."""
        return bool(self.nodes) and not self.knowing and not self.silent

    def message(self, *, required: bool) -> str:
        """Why the job is lock only, and what to do; for the refusal or the warning."""
        where = ", ".join(self.nodes)
        plural = "s" if len(self.nodes) > 1 else ""
        what = (
            f"job {self.job!r} is known to no agent of group {self.group!r} "
            f"(node{plural} {where}): its processes never registered with their node's agent"
        )
        fix = (
            "run it under `rlslice run`, set RLSLICE_AGENT_SOCKET for its client, or start "
            "its offload loop (app backend) before its first acquire"
        )
        if required:
            return f"{what}, and the group requires agent registration; {fix}"
        return f"{what}, so its switches move nothing of it (lock only); {fix}"


def judge(
    job: str,
    group: str,
    nodes: Iterable[str],
    answers: Mapping[str, Iterable[tuple[str, str]]],
) -> RegistrationVerdict:
    """`answers`: for each node that answered Status, its jobs as (job, group) pairs."""
    wanted = tuple(sorted(set(nodes)))
    knowing = tuple(
        node for node in wanted if node in answers and (job, group) in set(answers[node])
    )
    silent = tuple(node for node in wanted if node not in answers)
    return RegistrationVerdict(job, group, wanted, knowing, silent)
