"""`rlslice.env` owns the rules that turn names into places; the agent and its jobs use them.

Cases:
- a host name becomes a DNS-1123 label: first part, lower case, other characters as '-',
  at most 63 characters, `node` when nothing is left;
- the agent's default socket is under `$XDG_RUNTIME_DIR`, else under `/tmp/rlslice-<uid>`;
  a job looks at `RLSLICE_AGENT_SOCKET` first, then at that default;
- a job's `sim` folder: `RLSLICE_SIM_DIR`, else the root (`RLSLICE_SIM_ROOT` or the
  default) joined with the node given, `RLSLICE_NODE` or the host's node name;
- the agent's settings and the client's socket lookup take their defaults from these rules.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlslice import env
from rlslice._errors import InvalidArgumentError


@pytest.mark.parametrize(
    ("host", "node"),
    [
        ("gpu-07", "gpu-07"),
        ("GPU_Node7.cluster.example.com", "gpu-node7"),
        ("--edge--", "edge"),
        ("x" * 80, "x" * 63),
        ("___", "node"),
        ("", "node"),
    ],
)
def test_a_host_name_becomes_a_dns_label(host: str, node: str) -> None:
    assert env.default_node_name(host) == node


def test_the_default_node_name_is_this_hosts() -> None:
    assert env.default_node_name() == env.default_node_name(os.uname().nodename)


def test_the_agent_socket_lives_in_the_runtime_dir_else_in_tmp() -> None:
    assert env.default_agent_socket({"XDG_RUNTIME_DIR": "/run/user/1234"}) == Path(
        "/run/user/1234/rlslice/agent.sock"
    )
    assert env.default_agent_socket({}) == Path(f"/tmp/rlslice-{os.getuid()}/agent.sock")


def test_a_job_looks_for_the_agent_socket_in_its_variable_first() -> None:
    runtime = {"XDG_RUNTIME_DIR": "/run/user/1234"}
    assert env.agent_socket(runtime) == env.default_agent_socket(runtime)
    assert env.agent_socket({**runtime, env.AGENT_SOCKET: "/srv/a.sock"}) == Path("/srv/a.sock")
    assert env.agent_socket({**runtime, env.AGENT_SOCKET: ""}) == env.default_agent_socket(runtime)


def test_a_jobs_sim_folder_follows_dir_then_root_and_node() -> None:
    here = env.default_node_name()
    assert env.sim_root({}) == Path(env.DEFAULT_SIM_ROOT)
    assert env.sim_node_dir({}) == Path(env.DEFAULT_SIM_ROOT) / here
    assert env.sim_node_dir({env.SIM_ROOT: "/shm/x"}, "n1") == Path("/shm/x/n1")
    assert env.sim_node_dir({env.SIM_ROOT: "/shm/x", env.NODE: "n2"}) == Path("/shm/x/n2")
    assert env.sim_node_dir({env.NODE: "n2"}, "n1") == Path(env.DEFAULT_SIM_ROOT) / "n1"
    assert env.sim_node_dir({env.SIM_DIR: "/d", env.NODE: "n2"}, "n1") == Path("/d")


def test_a_sim_node_that_is_no_label_is_refused_naming_the_field() -> None:
    with pytest.raises(InvalidArgumentError, match=r"^node: "):
        env.sim_node_dir({env.NODE: "Not_A_Label"})


def test_the_agent_and_the_client_take_their_defaults_from_the_rules(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rlslice.client._local import default_socket_path
    from rlslice.snapshot_agent.settings import AgentSettings, SimSettings

    monkeypatch.delenv(env.AGENT_SOCKET, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1234")
    settings = AgentSettings(state_dir=Path("/unused"))
    assert settings.node == env.default_node_name()
    assert settings.socket_path == Path("/run/user/1234/rlslice/agent.sock")
    assert default_socket_path() == settings.socket_path
    assert SimSettings().root == env.sim_root({})
