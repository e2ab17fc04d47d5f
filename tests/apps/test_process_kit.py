"""The testing kit's process half (`rlslice.testing.Service`, `start_service`, `child_env`).

Cases:
- a child's environment drops inherited RLSLICE_* settings, sets PYTHONSAFEPATH=1 and
  takes `extra` on top;
- a service that exited fails `check_alive` (and `wait_serving`) with its exit code and
  the end of its log;
- `start_service` empties the log first; a restart appends to it, and counts the start;
- `stop` on a service that runs ends it; on one that exited it does nothing.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from rlslice.testing import Service, child_env, free_port, start_service, wait_serving


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_childs_environment_drops_rlslice_settings_and_takes_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RLSLICE_SCHEDULER", "127.0.0.1:1")
    monkeypatch.setenv("KEEP_ME", "yes")
    env = child_env({"RLSLICE_NODE": "n1"})
    assert "RLSLICE_SCHEDULER" not in env
    assert (env["KEEP_ME"], env["PYTHONSAFEPATH"], env["RLSLICE_NODE"]) == ("yes", "1", "n1")


def test_a_service_that_exited_fails_with_its_code_and_log_tail(tmp_path: Path) -> None:
    service = start_service(
        _python("print('about to fail'); raise SystemExit(3)"), tmp_path / "x.log"
    )
    assert service.process is not None
    service.process.wait(timeout=30)
    with pytest.raises(RuntimeError, match=r"exited with 3:\nabout to fail"):
        service.check_alive()
    with pytest.raises(RuntimeError, match="about to fail"):
        wait_serving(f"127.0.0.1:{free_port()}", service)


def test_start_service_empties_the_log_and_a_restart_appends(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("an older run\n")
    service = start_service(_python("print('run')"), log)
    assert service.process is not None
    service.process.wait(timeout=30)
    service.start()
    service.process.wait(timeout=30)
    assert (log.read_text(), service.starts) == ("run\nrun\n", 2)


def test_stop_ends_a_running_service_and_ignores_an_exited_one(tmp_path: Path) -> None:
    service = Service("sleeper", _python("import time; time.sleep(60)"), tmp_path / "s.log")
    service.start()
    assert service.alive
    service.stop(timeout=10)
    assert not service.alive
    service.stop()
    assert service.process is not None
    assert service.process.returncode == -signal.SIGTERM
