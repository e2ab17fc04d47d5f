"""Which nodes take part in a group. Pure.

A group's nodes are, first match wins:

1. its spec's `nodes`, as listed (a standalone config naming its machines);
2. with a `node_selector` (a TimeSliceGroup's `spec.nodeSelector`, put by the operator):
   every registered agent whose node labels (read by the agent from its Node, sent in
   RegisterAgent) contain each key with the same value, as a Kubernetes nodeSelector
   matches;
3. otherwise every registered agent.

Agents register under `rlslice._nodes.node_label(<Kubernetes node name>)`; names in `nodes`
go through the same mapping (a no-op for names that are DNS-1123 labels already).
"""

from __future__ import annotations

from collections.abc import Mapping

from rlslice._nodes import node_label
from rlslice.config import GroupSpec


def selector_matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """Whether a node with `labels` satisfies `selector` (every key present, equal value)."""
    return all(labels.get(key) == value for key, value in selector.items())


def group_nodes(spec: GroupSpec, agents: Mapping[str, Mapping[str, str]]) -> tuple[str, ...]:
    """The nodes of `spec`'s group, given the registered agents (node -> labels)."""
    if spec.nodes:
        return tuple(node_label(node) for node in spec.nodes)
    return tuple(
        sorted(
            node for node, labels in agents.items() if selector_matches(spec.node_selector, labels)
        )
    )
