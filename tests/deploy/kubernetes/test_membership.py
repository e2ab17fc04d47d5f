"""Group membership from node selectors (`scheduler.core.membership`), pure.

| spec                                  | agents (labels)                        | nodes          |
|---------------------------------------|----------------------------------------|----------------|
| no nodes, no selector                 | a, b                                   | a, b (sorted)  |
| selector pool=rl                      | a{pool: rl}, b{pool: batch}, c{}       | a              |
| selector pool=rl, gpu=h200            | a{pool: rl, gpu: h200}, b{pool: rl}    | a              |
| selector pool=rl                      | none match                             | ()             |
| nodes listed (selector ignored)       | anything                               | the list       |
| nodes listed with a label             | -                                      | kept as given  |
| selector value differs only in case   | a{pool: RL}                            | ()             |
Invariant (hypothesis): the selected nodes are exactly the agents whose labels contain the
selector, and adding labels to an agent never removes it from a group.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlslice.config import GroupSpec
from rlslice.scheduler.core.membership import group_nodes, selector_matches

AGENTS = {
    "gpu-b": {"pool": "batch"},
    "gpu-a": {"pool": "rl", "gpu": "h200"},
    "gpu-c": {},
    "gpu-d": {"pool": "rl"},
}


@pytest.mark.parametrize(
    ("spec", "agents", "nodes"),
    [
        (GroupSpec(name="g"), AGENTS, ("gpu-a", "gpu-b", "gpu-c", "gpu-d")),
        (GroupSpec(name="g", node_selector={"pool": "rl"}), AGENTS, ("gpu-a", "gpu-d")),
        (
            GroupSpec(name="g", node_selector={"pool": "rl", "gpu": "h200"}),
            AGENTS,
            ("gpu-a",),
        ),
        (GroupSpec(name="g", node_selector={"pool": "rl"}), {"x": {"pool": "batch"}}, ()),
        (GroupSpec(name="g", node_selector={"pool": "rl"}), {}, ()),
        (
            GroupSpec(name="g", nodes=("gpu-c", "gpu-b"), node_selector={"pool": "rl"}),
            AGENTS,
            ("gpu-c", "gpu-b"),
        ),
        (GroupSpec(name="g", node_selector={"pool": "rl"}), {"a": {"pool": "RL"}}, ()),
    ],
    ids=[
        "every-agent",
        "one-label",
        "two-labels",
        "none-match",
        "no-agents",
        "nodes-listed-win",
        "values-are-case-sensitive",
    ],
)
def test_a_groups_nodes_follow_its_node_selector(
    spec: GroupSpec, agents: dict[str, dict[str, str]], nodes: tuple[str, ...]
) -> None:
    assert group_nodes(spec, agents) == nodes


labels = st.dictionaries(st.sampled_from(["pool", "gpu", "zone"]), st.sampled_from("abc"))


@given(
    selector=labels,
    agents=st.dictionaries(st.from_regex(r"[a-z][a-z0-9]{0,5}", fullmatch=True), labels),
    extra=labels,
)
def test_selection_is_exactly_the_agents_containing_the_selector(
    selector: dict[str, str], agents: dict[str, dict[str, str]], extra: dict[str, str]
) -> None:
    chosen = group_nodes(GroupSpec(name="g", node_selector=selector), agents)
    assert set(chosen) == {n for n, mine in agents.items() if selector.items() <= mine.items()}
    assert list(chosen) == sorted(chosen)
    for node in chosen:  # more labels (keys the selector does not name) keep a node in
        more = {**{k: v for k, v in extra.items() if k not in selector}, **agents[node]}
        assert selector_matches(selector, more)
