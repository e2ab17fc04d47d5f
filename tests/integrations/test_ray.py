"""`@gpu_phase` on actor methods, against a real scheduler (plain classes stand in for Ray
actors; real subprocesses stand in for actor processes, reading the environment).

Cases:
- a plain method holds the group for the call and yields after; the client comes from the
  environment, once per process, shared by every decorated method (one registration);
- nested decorated calls share one hold (one grant); an exception still yields;
- an async method holds through an AsyncClient; async and plain generators hold until
  exhausted; a multi-group method holds both groups;
- the wrapper keeps name, docstring, signature, kind and attributes set beneath it;
- explicit clients and factories; refused combinations (wrong client kind, bad names,
  group and groups together, a sync and an async client of one job in one process);
- two real processes with the same decorated class take turns: their calls never overlap.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from rlslice._errors import FailedPreconditionError, InvalidArgumentError
from rlslice.client import AsyncClient, Client
from rlslice.integrations import ray as rlslice_ray
from rlslice.integrations.ray import (
    aclose_process_clients,
    gpu_phase,
    process_async_client,
    process_client,
)
from rlslice.testing import SchedulerForTests

EXPORTS = {
    "ClientSource",
    "aclose_process_clients",
    "close_process_clients",
    "gpu_phase",
    "process_async_client",
    "process_client",
}


def test_the_module_exports_exactly_the_pinned_names() -> None:
    assert set(rlslice_ray.__all__) == EXPORTS
    for name in EXPORTS:
        assert hasattr(rlslice_ray, name)


class Rollout:
    """A stand-in for a Ray actor class."""

    def __init__(self, sched: SchedulerForTests) -> None:
        self.sched = sched
        self.seen: list[str] = []

    @gpu_phase("rollout")
    def generate(self, prompts: list[str], *, temperature: float = 1.0) -> list[str]:
        """Generate completions."""
        self.seen.append(self.sched.group("gpus").holder)
        return [p + "!" for p in prompts]

    @gpu_phase("rollout")
    def generate_twice(self, prompts: list[str]) -> list[str]:
        return self.generate(self.generate(prompts))

    @gpu_phase("rollout")
    def fail(self) -> None:
        raise RuntimeError("out of memory")

    @gpu_phase("rollout")
    def stream(self, n: int) -> Iterator[int]:
        for i in range(n):
            self.seen.append(self.sched.group("gpus").holder)
            yield i


def test_a_plain_method_holds_the_group_for_the_call_and_yields_after(
    job_env: SchedulerForTests,
) -> None:
    actor = Rollout(job_env)
    assert actor.generate(["a", "b"]) == ["a!", "b!"]
    assert actor.seen == ["grpo-a"]
    status = job_env.group("gpus")
    assert status.holder == ""
    assert [j.job for j in status.jobs] == ["grpo-a"]


def test_every_decorated_method_of_a_process_shares_one_client_from_the_environment(
    job_env: SchedulerForTests,
) -> None:
    first, second = Rollout(job_env), Rollout(job_env)
    first.generate(["a"])
    second.generate(["b"])
    client = process_client()
    assert client is process_client()
    assert (client.job, client.group, client.scheduler) == ("grpo-a", "gpus", job_env.address)


def test_nested_decorated_calls_share_one_hold(job_env: SchedulerForTests) -> None:
    actor = Rollout(job_env)
    actor.generate(["warm-up"])
    before = job_env.group("gpus").epoch
    assert actor.generate_twice(["a"]) == ["a!!"]
    assert job_env.group("gpus").epoch == before + 1
    assert job_env.group("gpus").holder == ""


def test_an_exception_in_the_method_still_yields_the_group(job_env: SchedulerForTests) -> None:
    actor = Rollout(job_env)
    with pytest.raises(RuntimeError, match="out of memory"):
        actor.fail()
    assert job_env.group("gpus").holder == ""


def test_a_generator_method_holds_the_group_until_it_is_exhausted(
    job_env: SchedulerForTests,
) -> None:
    actor = Rollout(job_env)
    stream = actor.stream(3)
    assert next(stream) == 0
    assert job_env.group("gpus").holder == "grpo-a"
    assert list(stream) == [1, 2]
    assert actor.seen == ["grpo-a"] * 3
    assert job_env.group("gpus").holder == ""


def test_a_generator_closed_early_yields_the_group(job_env: SchedulerForTests) -> None:
    stream = Rollout(job_env).stream(5)
    next(stream)
    stream.close()
    assert job_env.group("gpus").holder == ""


class AsyncRollout:
    def __init__(self, sched: SchedulerForTests) -> None:
        self.sched = sched

    @gpu_phase("rollout")
    async def generate(self, prompt: str) -> str:
        await asyncio.sleep(0)
        return f"{prompt}:{self.sched.group('gpus').holder}"

    @gpu_phase("rollout")
    async def stream(self, n: int) -> AsyncIterator[str]:
        for _ in range(n):
            yield self.sched.group("gpus").holder


async def test_an_async_method_holds_the_group_through_an_async_client(
    job_env: SchedulerForTests,
) -> None:
    actor = AsyncRollout(job_env)
    try:
        assert await actor.generate("p") == "p:grpo-a"
        assert job_env.group("gpus").holder == ""
        assert isinstance(process_async_client(), AsyncClient)
        assert [h async for h in actor.stream(2)] == ["grpo-a", "grpo-a"]
        assert job_env.group("gpus").holder == ""
    finally:
        await aclose_process_clients()
    assert job_env.group("gpus").jobs == []


async def test_concurrent_async_calls_of_one_actor_share_one_hold(
    job_env: SchedulerForTests,
) -> None:
    actor = AsyncRollout(job_env)
    try:
        await actor.generate("warm-up")
        before = job_env.group("gpus").epoch
        results = await asyncio.gather(*(actor.generate(str(i)) for i in range(4)))
        assert results == [f"{i}:grpo-a" for i in range(4)]
        assert job_env.group("gpus").epoch == before + 1
    finally:
        await aclose_process_clients()


def test_a_multi_group_method_holds_both_groups(sched: SchedulerForTests) -> None:
    seen: list[tuple[str, str]] = []
    with Client(job="sync-job", scheduler=sched.address) as client:

        @gpu_phase("sync", groups=["trainer-pool", "sampler-pool"], client=client)
        def sync_weights() -> None:
            seen.append((sched.group("trainer-pool").holder, sched.group("sampler-pool").holder))

        sync_weights()
    assert seen == [("sync-job", "sync-job")]
    assert sched.group("trainer-pool").holder == sched.group("sampler-pool").holder == ""


def test_the_wrapper_keeps_what_ray_inspects() -> None:
    def annotated(self: object, x: int, *, y: str = "") -> int:
        """Doc."""
        return x

    annotated.__ray_num_returns__ = 2  # type: ignore[attr-defined]  # as @ray.method sets
    wrapped = gpu_phase("rollout")(annotated)
    assert wrapped.__name__ == "annotated"
    assert wrapped.__doc__ == "Doc."
    assert inspect.signature(wrapped) == inspect.signature(annotated)
    assert wrapped.__ray_num_returns__ == 2  # type: ignore[attr-defined]
    assert not inspect.iscoroutinefunction(wrapped)
    assert inspect.iscoroutinefunction(AsyncRollout.generate)
    assert inspect.isasyncgenfunction(AsyncRollout.stream)
    assert inspect.isgeneratorfunction(Rollout.stream)
    assert Rollout.generate.__qualname__ == "Rollout.generate"


def test_a_factory_is_called_once_per_process(sched: SchedulerForTests) -> None:
    built: list[Client] = []

    def factory() -> Client:
        built.append(Client(job="from-factory", group="gpus", scheduler=sched.address))
        return built[-1]

    @gpu_phase("train", client=factory)
    def step() -> str:
        return sched.group("gpus").holder

    assert [step(), step()] == ["from-factory", "from-factory"]
    assert len(built) == 1


def test_without_a_scheduler_configured_the_method_just_runs() -> None:
    @gpu_phase("train")
    def step(x: int) -> int:
        return x + 1

    assert step(1) == 2
    assert process_client().disabled


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: gpu_phase(""), InvalidArgumentError, "phase"),
        (lambda: gpu_phase("train", group="GPUS"), InvalidArgumentError, "group"),
        (lambda: gpu_phase("sync", groups="trainer-pool"), InvalidArgumentError, "groups"),
        (lambda: gpu_phase("sync", groups=[]), InvalidArgumentError, "groups"),
        (lambda: gpu_phase("sync", groups=["a", "B"]), InvalidArgumentError, r"groups\[1\]"),
        (lambda: gpu_phase("sync", "a", groups=["b"]), InvalidArgumentError, "not both"),
    ],
)
def test_bad_arguments_are_refused_when_the_class_is_defined(
    call: object, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        call()  # type: ignore[operator]


def test_a_client_of_the_wrong_kind_is_refused_at_decoration() -> None:
    async def coroutine() -> None:
        return None

    def plain() -> None:
        return None

    with pytest.raises(TypeError, match="needs an AsyncClient"):
        gpu_phase("x", client=Client())(coroutine)
    with pytest.raises(TypeError, match="needs a Client"):
        gpu_phase("x", client=AsyncClient())(plain)


async def test_a_process_cannot_build_both_kinds_of_client_for_one_job(
    job_env: SchedulerForTests,
) -> None:
    @gpu_phase("rollout")
    def plain() -> None:
        return None

    @gpu_phase("rollout")
    async def coroutine() -> None:
        return None

    try:
        await coroutine()
        with pytest.raises(FailedPreconditionError, match="already has an AsyncClient"):
            await asyncio.to_thread(plain)
    finally:
        await aclose_process_clients()


CHILD = textwrap.dedent(
    """
    import json, sys, time
    from rlslice.integrations.ray import gpu_phase

    class Learner:
        @gpu_phase("train")
        def step(self):
            start = time.monotonic()
            time.sleep(0.15)
            return start, time.monotonic()

    learner = Learner()
    print(json.dumps([learner.step() for _ in range(3)]), flush=True)
    """
)


def test_two_processes_with_the_same_decorated_class_take_turns(
    sched: SchedulerForTests, tmp_path: Path
) -> None:
    script = tmp_path / "learner.py"
    script.write_text(CHILD)
    results: dict[str, list[list[float]]] = {}

    def run(job: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RLSLICE_")}
        env |= {"RLSLICE_SCHEDULER": sched.address, "RLSLICE_JOB": job}
        env |= {"RLSLICE_GROUP": "gpus", "PYTHONSAFEPATH": "1"}
        done = subprocess.run(
            [sys.executable, str(script)],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        results[job] = json.loads(done.stdout)

    threads = [threading.Thread(target=run, args=(job,)) for job in ("job-a", "job-b")]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert set(results) == {"job-a", "job-b"}
    intervals = sorted((start, end, job) for job, calls in results.items() for start, end in calls)
    assert len(intervals) == 6
    for (_, end, _), (start, _, _) in itertools.pairwise(intervals):
        assert start >= end, f"calls overlapped: {intervals}"
    assert all(start >= started for start, _, _ in intervals)
    status = sched.group("gpus")
    assert status.holder == ""
    assert status.jobs == []  # both processes closed their clients at exit
