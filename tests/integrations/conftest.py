"""Fixtures for the integration tests: a real scheduler in-process on loopback, a clean
environment, and a fresh per-process client registry for every test."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from rlslice.integrations import _clients
from rlslice.testing import SchedulerForTests


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in list(os.environ):
        if name.startswith("RLSLICE_"):
            monkeypatch.delenv(name)
    yield
    _clients.close_process_clients()
    _clients._registry = _clients._Registry()


@pytest.fixture
def sched() -> Iterator[SchedulerForTests]:
    with SchedulerForTests(groups=["gpus", "trainer-pool", "sampler-pool"]) as running:
        yield running
        # Close the process's clients while their scheduler still answers (a closing client
        # retries Unregister for its lease's time when the scheduler is gone).
        _clients.close_process_clients()


@pytest.fixture
def job_env(monkeypatch: pytest.MonkeyPatch, sched: SchedulerForTests) -> SchedulerForTests:
    """The environment Ray's runtime_env would give an actor: scheduler, job, group."""
    monkeypatch.setenv("RLSLICE_SCHEDULER", sched.address)
    monkeypatch.setenv("RLSLICE_JOB", "grpo-a")
    monkeypatch.setenv("RLSLICE_GROUP", "gpus")
    return sched
