"""`GpuPhaseCallback(hold="train", offer="asked")`: a rollout job ends its phase early at
the next step boundary when a train waits, against a real scheduler on loopback.

The group declares `rollout` and `train` phase kinds (policy `stage`). The callback's job
holds its `rollout` phase across steps; the Trainer's events are called in its order.

Cases:
- with nobody waiting, step ends give nothing up (one grant for the whole run);
- once another job's `train` waits, the callback learns it (`should_yield()`), gives the
  group up at the next step end, the train runs, and the callback holds again before the
  next step begins (it never runs a step without the group);
- a waiting `rollout` of a third job asks nothing: its step ends keep the group;
- offer="asked" is refused for a bad value.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from rlslice._errors import InvalidArgumentError
from rlslice.client import Client
from rlslice.config import GroupSpec, PhaseKind, PhaseSpec, Policy
from rlslice.integrations.trl import GpuPhaseCallback
from rlslice.testing import SchedulerForTests

ARGS = SimpleNamespace(save_strategy="steps")
CONTROL = SimpleNamespace(
    should_log=False, should_evaluate=False, should_save=False, should_training_stop=False
)
LEASE = 1.0  # a keep-alive every third of a second: requests arrive quickly
SPEC = GroupSpec(
    name="gpus",
    policy=Policy.STAGE,
    phases={
        "rollout": PhaseSpec(kind=PhaseKind.ROLLOUT),
        "train": PhaseSpec(kind=PhaseKind.TRAIN),
    },
)


@pytest.fixture
def sched() -> Iterator[SchedulerForTests]:
    with SchedulerForTests(groups=[SPEC]) as running:
        yield running


def _until(condition: object, what: str, timeout: float = 15.0) -> None:
    give_up = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < give_up, f"never: {what}"
        time.sleep(0.02)


def _client(sched: SchedulerForTests, job: str) -> Client:
    return Client(job=job, group="gpus", scheduler=sched.address, lease_seconds=LEASE)


def _step(callback: GpuPhaseCallback) -> None:
    callback.on_step_begin(ARGS, None, CONTROL)
    assert callback.held  # a step never runs without the group
    callback.on_step_end(ARGS, None, CONTROL)


def test_a_rollout_callback_yields_at_the_next_step_end_when_a_train_waits(
    sched: SchedulerForTests,
) -> None:
    turns: list[str] = []
    with GpuPhaseCallback(
        lambda: _client(sched, "grpo-a"), phase="rollout", hold="train", offer="asked"
    ) as callback:
        callback.on_train_begin(ARGS, None, CONTROL)
        for _ in range(3):
            _step(callback)
        assert (callback.grants, callback.early_yields) == (1, 0)

        def trainer() -> None:
            with _client(sched, "grpo-b") as other, other.phase("train"):
                turns.append(sched.group("gpus").holder)

        thread = threading.Thread(target=trainer)
        thread.start()
        _until(lambda: list(sched.group("gpus").queue) == ["grpo-b"], "the train queued")
        _until(callback.should_yield, "the rollout was asked to yield")
        _step(callback)  # its end gives the group to the train, then takes it back
        thread.join(15)
        assert not thread.is_alive()
        assert turns == ["grpo-b"]
        assert (callback.grants, callback.early_yields) == (2, 1)
        assert sched.group("gpus").holder == "grpo-a"

        # A waiting rollout of another job asks nothing of this rollout.
        with _client(sched, "grpo-c") as third:
            waiting = threading.Thread(target=lambda: third.acquire(phase="rollout"))
            waiting.start()
            _until(lambda: list(sched.group("gpus").queue) == ["grpo-c"], "c queued")
            assert not callback.client().wait_yield_requested(timeout=4 * LEASE)
            _step(callback)
            assert (callback.grants, callback.early_yields) == (2, 1)
            callback.on_train_end(ARGS, None, CONTROL)
            waiting.join(15)
            assert not waiting.is_alive()
            assert sched.group("gpus").holder == "grpo-c"


def test_a_bad_offer_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="offer"):
        GpuPhaseCallback(offer="never")  # type: ignore[arg-type]
