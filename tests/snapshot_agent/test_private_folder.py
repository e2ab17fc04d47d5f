"""The relay's private folder: one fixed folder per agent, emptied at start, never a new
temporary folder per run (a killed agent used to leak one `rlslice-agent-*` each time).

Cases: two runs of a killed agent leave no new folder in the temporary directory and reuse
`<state_dir>/relay`; a state directory too long for a socket address maps to one stable
folder; a second agent on the same state directory does not empty a live agent's folder.
"""

from __future__ import annotations

import asyncio
import signal
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from rlslice.snapshot_agent import AgentSettings, start_agent
from rlslice.snapshot_agent.peercred import SocketInUseError, private_folder


def _leftovers() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("rlslice-agent-*")}


async def test_a_killed_agent_leaves_no_folder_behind_and_its_restart_reuses_its_own(
    make_settings: Callable[..., AgentSettings],
) -> None:
    settings = make_settings("n2")
    args = [
        sys.executable, "-m", "rlslice.apps", "agent", "--node", "n2",
        "--address", "127.0.0.1:0", "--socket", str(settings.socket_path),
        "--state-dir", str(settings.state_dir), "--sim-root", str(settings.sim.root),
        "--sim-capacity", "64MiB", "--host-reserve", "0",
    ]  # fmt: skip
    folder = private_folder(settings.state_dir)
    before = _leftovers()
    for _ in range(2):
        process = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.PIPE)
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        assert " serving on " in line
        assert folder.is_dir()
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert (folder / "g").is_socket()
        process.send_signal(signal.SIGKILL)
        await process.wait()
    assert _leftovers() == before


def test_a_state_directory_too_long_for_a_socket_address_maps_to_one_stable_folder(
    tmp_path: Path,
) -> None:
    short = Path("/var/lib/rlslice/agent")
    assert private_folder(short) == short / "relay"
    deep = tmp_path / ("x" * 100) / "agent"
    chosen = private_folder(deep)
    assert chosen.parent == Path(tempfile.gettempdir())
    assert chosen.name.startswith("rlslice-agent-")
    assert private_folder(deep) == chosen
    assert private_folder(tmp_path / ("y" * 100)) != chosen


async def test_a_second_agent_on_the_same_state_directory_leaves_the_live_ones_folder(
    make_settings: Callable[..., AgentSettings], short_dir: Path
) -> None:
    first = await start_agent(make_settings("n2"))
    try:
        other_socket = short_dir / "other.sock"
        with pytest.raises(SocketInUseError, match="state_dir"):
            await start_agent(
                make_settings("n3", state_dir=first.settings.state_dir, socket_path=other_socket)
            )
        assert (private_folder(first.settings.state_dir) / "g").is_socket()
    finally:
        await first.stop(0)
