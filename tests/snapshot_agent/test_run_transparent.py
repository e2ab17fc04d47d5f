"""`rlslice run --transparent`: torch-memory-saver's hook library preloaded for CMD.

Faked at the library boundary: a `torch_memory_saver` package on PYTHONPATH whose
`utils.get_binary_path_from_package` names a library path. Cases: the path goes first in
CMD's LD_PRELOAD, before what was there; without the package, exit 2 saying what to install.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PRINT_PRELOAD = "import os; print(os.environ.get('LD_PRELOAD', ''))"


def rlslice_run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rlslice.apps", "run", "--no-register", "--job", "j", "--group",
         "g", *args, "--", sys.executable, "-c", PRINT_PRELOAD],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_the_hook_library_goes_first_in_ld_preload(tmp_path: Path) -> None:
    package = tmp_path / "torch_memory_saver"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "utils.py").write_text(
        "def get_binary_path_from_package(name):\n    return '/opt/tms/' + name + '.so'\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "LD_PRELOAD": "libother.so"}
    done = rlslice_run("--transparent", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "/opt/tms/torch_memory_saver_hook_mode_preload.so:libother.so"


def test_without_torch_memory_saver_it_says_what_to_install(tmp_path: Path) -> None:
    package = tmp_path / "torch_memory_saver"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('not built for this CUDA')")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    env.pop("LD_PRELOAD", None)
    done = rlslice_run("--transparent", env=env)
    assert done.returncode == 2
    assert "pip install torch-memory-saver" in done.stderr
    plain = rlslice_run(env=env)  # without the flag nothing is preloaded
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.strip() == ""
