"""`GpuPhaseCallback`, driven by the Trainer's events, against a real scheduler.

Most cases call the events in the order `Trainer` calls them, with its `control` flags (fast,
and every branch reachable); a last test runs a real `transformers.Trainer` (transformers
and accelerate are dev dependencies) for a few steps.

Cases:
- one optimizer step (with gradient-accumulation substeps) is one hold; between steps the
  job holds nothing;
- logging, evaluation and saving right after a step stay inside the hold, given back
  after the last of them; an end-of-epoch evaluation is held too; the run's last step is held
  until on_train_end;
- hold="train" holds the whole run and offers the group at each step end: a waiting job
  takes its turn there;
- `yield_group()` gives the group back and keeps the job registered;
- leaving the `with` block after a failure gives the group back and closes the client it
  built;
- the end of training with a client it built leaves the group while holding it (Unregister,
  no Yield: a waiting job's switch cannot snapshot it on the way out); a given client yields;
- offload=True registers the model and the optimizer the Trainer passes to on_train_begin
  (no scheduler: no loop starts); a real Trainer with offload=True and no scheduler;
- events it does not handle are no-ops; bad arguments are refused; disabled passes through;
- a real Trainer (optional).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rlslice._errors import InvalidArgumentError
from rlslice.client import Client
from rlslice.integrations import trl as rlslice_trl
from rlslice.integrations.trl import GpuPhaseCallback
from rlslice.testing import SchedulerForTests

ARGS = SimpleNamespace(save_strategy="steps")


def control(**flags: bool) -> SimpleNamespace:
    fields = ("should_log", "should_evaluate", "should_save", "should_training_stop")
    return SimpleNamespace(**{name: flags.get(name, False) for name in fields})


def holder(sched: SchedulerForTests) -> str:
    return sched.group("gpus").holder


def test_the_module_exports_exactly_the_pinned_names() -> None:
    assert rlslice_trl.__all__ == ["GpuPhaseCallback"]


def test_one_optimizer_step_is_one_hold(job_env: SchedulerForTests) -> None:
    with GpuPhaseCallback() as callback:
        callback.on_train_begin(ARGS, None, control())
        assert holder(job_env) == ""
        for _ in range(2):
            callback.on_step_begin(ARGS, None, control())
            assert holder(job_env) == "grpo-a"
            callback.on_substep_end(ARGS, None, control())  # accumulation: still held
            assert holder(job_env) == "grpo-a"
            callback.on_step_end(ARGS, None, control())
            assert holder(job_env) == ""
        assert callback.grants == 2
        assert callback.last_grant is not None
        assert callback.last_grant.job == "grpo-a"
        callback.on_train_end(ARGS, None, control(should_training_stop=True))
    assert job_env.group("gpus").jobs == []  # the client it built was closed


@pytest.mark.parametrize(
    ("flags", "events", "given_back_after"),
    [
        ({"should_log": True}, [("on_log", {})], "on_log"),
        (
            {"should_log": True, "should_evaluate": True, "should_save": True},
            [
                ("on_log", {"should_evaluate": True, "should_save": True}),
                ("on_evaluate", {"should_save": True}),
                ("on_save", {}),
            ],
            "on_save",
        ),
        ({"should_evaluate": True}, [("on_evaluate", {})], "on_evaluate"),
    ],
)
def test_device_work_right_after_a_step_stays_inside_the_hold(
    job_env: SchedulerForTests,
    flags: dict[str, bool],
    events: list[tuple[str, dict[str, bool]]],
    given_back_after: str,
) -> None:
    with GpuPhaseCallback() as callback:
        callback.on_step_begin(ARGS, None, control())
        callback.on_step_end(ARGS, None, control(**flags))
        for event, after in events:
            assert holder(job_env) == "grpo-a", f"given back before {event}"
            getattr(callback, event)(ARGS, None, control(**after))
        assert holder(job_env) == "", f"still held after {given_back_after}"
        assert callback.grants == 1


def test_with_save_on_best_the_hold_lasts_past_evaluation(job_env: SchedulerForTests) -> None:
    best = SimpleNamespace(save_strategy="best")
    with GpuPhaseCallback() as callback:
        callback.on_step_begin(best, None, control())
        callback.on_step_end(best, None, control(should_evaluate=True))
        callback.on_evaluate(best, None, control())
        assert holder(job_env) == "grpo-a"  # the trainer may save next
        callback.on_step_begin(best, None, control())  # no save came: the next step
        assert callback.grants == 1
        callback.on_step_end(best, None, control())
        assert holder(job_env) == ""


def test_an_end_of_epoch_evaluation_is_held(job_env: SchedulerForTests) -> None:
    with GpuPhaseCallback() as callback:
        callback.on_step_begin(ARGS, None, control())
        callback.on_step_end(ARGS, None, control())
        callback.on_epoch_end(ARGS, None, control(should_evaluate=True))
        assert holder(job_env) == "grpo-a"
        callback.on_evaluate(ARGS, None, control())
        assert holder(job_env) == ""
        assert callback.grants == 2


def test_the_last_step_is_held_until_train_end(job_env: SchedulerForTests) -> None:
    with GpuPhaseCallback() as callback:
        callback.on_step_begin(ARGS, None, control())
        callback.on_step_end(ARGS, None, control(should_log=True, should_training_stop=True))
        callback.on_log(ARGS, None, control(should_training_stop=True))
        assert holder(job_env) == "grpo-a"  # the trainer reads the final loss next
        callback.on_train_end(ARGS, None, control(should_training_stop=True))
        assert holder(job_env) == ""
        assert not callback.held


def test_hold_train_offers_the_group_to_a_waiting_job_at_each_step_end(
    job_env: SchedulerForTests,
) -> None:
    turns: list[str] = []
    with GpuPhaseCallback(hold="train") as callback:
        callback.on_train_begin(ARGS, None, control())
        callback.on_step_begin(ARGS, None, control())
        assert holder(job_env) == "grpo-a"

        def other_job() -> None:
            with (
                Client(job="grpo-b", group="gpus", scheduler=job_env.address) as other,
                other.phase("rollout"),
            ):
                turns.append(holder(job_env))
                time.sleep(0.2)

        thread = threading.Thread(target=other_job)
        thread.start()
        give_up = time.monotonic() + 5
        while list(job_env.group("gpus").queue) == [] and time.monotonic() < give_up:
            time.sleep(0.02)
        assert turns == []  # it waits: the callback holds the group between events
        callback.on_step_end(ARGS, None, control())  # offer: yield, queue again, wait
        assert turns == ["grpo-b"]
        assert holder(job_env) == "grpo-a"
        thread.join()
        callback.on_train_end(ARGS, None, control(should_training_stop=True))
        assert holder(job_env) == ""
        assert callback.grants == 2


def test_yield_group_gives_the_group_back_and_keeps_the_job_registered(
    job_env: SchedulerForTests,
) -> None:
    with GpuPhaseCallback() as callback:
        callback.acquire()
        assert holder(job_env) == "grpo-a"
        callback.yield_group()
        assert not callback.held
        assert holder(job_env) == ""
        assert [j.job for j in job_env.group("gpus").jobs] == ["grpo-a"]
        callback.yield_group()  # holding nothing: nothing to give back
        assert callback.grants == 1


def test_leaving_the_block_after_a_failure_gives_back_and_closes(
    job_env: SchedulerForTests,
) -> None:
    def train(callback: GpuPhaseCallback) -> None:
        callback.on_step_begin(ARGS, None, control())
        raise RuntimeError("CUDA error")  # the Trainer calls no event on failure

    callback = GpuPhaseCallback()
    with pytest.raises(RuntimeError, match="CUDA error"), callback:
        train(callback)
    assert not callback.held
    status = job_env.group("gpus")
    assert status.holder == ""
    assert status.jobs == []


def _events(sched: SchedulerForTests, job: str) -> list[int]:
    import grpc

    from rlslice.v1alpha1 import scheduler_pb2 as pb
    from rlslice.v1alpha1 import scheduler_pb2_grpc

    with grpc.insecure_channel(sched.address) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        answer = stub.GetEvents(pb.GetEventsRequest(group="gpus"), timeout=10)
    return [e.kind for e in answer.events if e.job == job]


def test_the_end_of_training_leaves_the_group_while_holding_it(
    job_env: SchedulerForTests,
) -> None:
    from rlslice.v1alpha1 import scheduler_pb2 as pb

    granted = threading.Event()
    with Client(job="grpo-b", group="gpus", scheduler=job_env.address) as other:
        with GpuPhaseCallback() as callback:
            callback.on_step_begin(ARGS, None, control())
            callback.on_step_end(ARGS, None, control(should_training_stop=True))

            def waiter() -> None:
                with other.phase("rollout"):
                    granted.set()

            thread = threading.Thread(target=waiter)
            thread.start()
            give_up = time.monotonic() + 5
            while list(job_env.group("gpus").queue) == [] and time.monotonic() < give_up:
                time.sleep(0.02)
            assert list(job_env.group("gpus").queue) == ["grpo-b"]
            callback.on_train_end(ARGS, None, control(should_training_stop=True))
            thread.join(10)
            assert granted.is_set()
        kinds = _events(job_env, "grpo-a")
        last_grant = max(i for i, k in enumerate(kinds) if k == pb.EVENT_KIND_GRANTED)
        assert kinds[last_grant + 1 :] == [pb.EVENT_KIND_UNREGISTERED]  # no yield first


def test_with_a_given_client_the_end_of_training_yields(sched: SchedulerForTests) -> None:
    from rlslice.v1alpha1 import scheduler_pb2 as pb

    with Client(job="mine", group="gpus", scheduler=sched.address) as client:
        callback = GpuPhaseCallback(client)
        callback.on_step_begin(ARGS, None, control())
        callback.on_train_end(ARGS, None, control(should_training_stop=True))
        assert [j.job for j in sched.group("gpus").jobs] == ["mine"]  # still registered
        assert _events(sched, "mine")[-1] == pb.EVENT_KIND_YIELDED


def test_offload_registers_the_model_and_the_optimizer_it_is_given() -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with GpuPhaseCallback(offload=True) as callback:
        assert callback.offloader is None
        callback.on_train_begin(ARGS, None, control(), model=model, optimizer=optimizer)
        assert callback.offloader is not None
        assert callback.offloader.tags == ("weights", "optimizer")
        assert callback.offloader.offload().bytes == (16 + 4) * 4
        callback.on_step_begin(ARGS, None, control(), model=model, optimizer=optimizer)
    # Leaving with state parked (here: offloaded by hand) copies it back in-process.
    assert model.weight.untyped_storage().nbytes() == 16 * 4
    assert not callback.offloader.offloaded


def test_a_given_client_is_not_closed_by_the_callback(sched: SchedulerForTests) -> None:
    with Client(job="mine", group="gpus", scheduler=sched.address) as client:
        callback = GpuPhaseCallback(client, phase="grpo-step")
        callback.on_step_begin(ARGS, None, control())
        callback.on_train_end(ARGS, None, control())
        assert callback.client() is client
        with client.phase("after"):
            assert sched.group("gpus").holder == "mine"


def test_events_it_does_not_handle_are_no_ops_and_other_names_are_errors() -> None:
    callback = GpuPhaseCallback()
    for event in ("on_init_end", "on_optimizer_step", "on_prediction_step", "on_new_event"):
        assert getattr(callback, event)(ARGS, None, control(), model=object()) is None
    with pytest.raises(AttributeError, match="not_an_event"):
        callback.not_an_event  # noqa: B018


def test_without_a_scheduler_every_step_passes_through() -> None:
    with GpuPhaseCallback() as callback:
        callback.on_step_begin(ARGS, None, control())
        assert callback.last_grant is not None
        assert callback.last_grant.disabled
        callback.on_step_end(ARGS, None, control())
        assert not callback.held


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"phase": ""}, "phase"), ({"group": "GPUS"}, "group"), ({"hold": "epoch"}, "hold")],
)
def test_bad_arguments_are_refused(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        GpuPhaseCallback(**kwargs)


def test_a_real_trainer_holds_the_group_around_each_step(
    job_env: SchedulerForTests, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=32, n_positions=16)
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, 32, (16, 8))
    dataset = [{"input_ids": row, "labels": row} for row in ids]
    seen: dict[str, list[str]] = {"step_begin": [], "substep": [], "step_end": []}

    class Spy:  # runs after the rlslice callback, as Trainer calls callbacks in order
        def __getattr__(self, name: str) -> Any:
            if name.startswith("on_"):
                return lambda *args, **kwargs: None
            raise AttributeError(name)

        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            seen["step_begin"].append(holder(job_env))

        def on_substep_end(self, *args: Any, **kwargs: Any) -> None:
            seen["substep"].append(holder(job_env))

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=4,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        logging_steps=2,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    with GpuPhaseCallback() as callback:
        trainer = transformers.Trainer(
            model=model, args=args, train_dataset=dataset, callbacks=[callback, Spy()]
        )
        trainer.train()
        assert seen["step_begin"] == ["grpo-a"] * 4
        assert seen["substep"] == ["grpo-a"] * 4
        assert callback.grants == 4
        assert not callback.held
    status = job_env.group("gpus")
    assert status.holder == ""
    assert status.epoch >= 4
