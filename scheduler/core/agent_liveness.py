"""Agent liveness: which registered agents have not been heard from for too long.

An agent re-registers every `renew_seconds` (`snapshot_agent.scheduler_link`); the
scheduler stamps each registration with its clock. An agent silent for longer than
`expiry_seconds` is expired. Pure: the caller passes the time and what state is where.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping


def expired(heard: Mapping[str, float], now: float, expiry_seconds: float | None) -> list[str]:
    """Nodes whose agent was last heard more than `expiry_seconds` before `now` (sorted);
    none when expiry is off (`None` or not positive)."""
    if expiry_seconds is None or expiry_seconds <= 0:
        return []
    return sorted(node for node, at in heard.items() if now - at > expiry_seconds)


def split(
    nodes: list[str], state_on: Callable[[str], str | None]
) -> tuple[list[str], dict[str, str]]:
    """(nodes to remove, node -> why it is kept): a node that still holds a job's state
    (`state_on` names it) is kept, so a switch through it fails naming the node."""
    remove: list[str] = []
    kept: dict[str, str] = {}
    for node in nodes:
        why = state_on(node)
        if why is None:
            remove.append(node)
        else:
            kept[node] = why
    return remove, kept
