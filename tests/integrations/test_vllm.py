"""`rlslice.integrations.vllm` at its boundary: stand-in engines with vLLM's API shape
(vLLM itself cannot run here), a real scheduler on loopback, real clients.

The stand-ins keep what the module calls: the sync `LLMEngine`'s `add_request`, `step`
(outputs with `request_id`, `finished`, `text`) and `abort_request`; `AsyncLLM`'s
`generate` (an async iterator of outputs) and `abort`; `sleep` / `wake_up`. Each request
makes one token per step; its text is the prompt and the token count, so a request run
again after an abort ends with the same text. A stand-in holds its rollout at one step
until the scheduler has asked the job to yield (a long rollout, without sleeping on time).

Cases, for the sync and the async rollout:
- with nobody waiting, every request is generated in one hold and nothing is yielded;
- mode="wait": once a train waits, no new request is admitted, the ones in flight finish,
  the group goes to the train while requests remain (none in flight then, none aborted),
  and the rollout comes back and finishes every request with the right text;
- mode="abort": the requests in flight are aborted at once, the train runs, and they run
  again (fresh engine ids) to the same text;
- sleep_level: the engine sleeps before the early yield and wakes after the next grant;
- bad arguments (mode, max_in_flight, duplicate ids, sleep_level without a sleeper).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from rlslice import AsyncClient, Client
from rlslice._errors import InvalidArgumentError
from rlslice.config import GroupSpec, PhaseKind, PhaseSpec, Policy
from rlslice.integrations.vllm import AsyncVllmRollout, VllmRollout
from rlslice.testing import SchedulerForTests, scheduler_for_tests

LEASE = 1.0  # a keep-alive every third of a second
SPEC = GroupSpec(
    name="gpus",
    policy=Policy.STAGE,
    phases={"rollout": PhaseSpec(kind=PhaseKind.ROLLOUT), "train": PhaseSpec(kind=PhaseKind.TRAIN)},
)
TOKENS = 4  # steps each request takes
REQUESTS = [(f"r{i}", f"p{i}", TOKENS) for i in range(12)]
EXPECTED = {rid: f"{prompt}:{TOKENS}" for rid, prompt, _ in REQUESTS}
GATE_STEP = 2  # the stand-in holds here until the job is asked to yield


def _wait(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    give_up = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < give_up, f"never: {what}"
        time.sleep(0.01)


class StepStandIn:
    """vLLM's sync `LLMEngine` shape: add_request, step, abort_request; sleep, wake_up."""

    def __init__(self, gate: Callable[[], bool] | None = None) -> None:
        self.gate = gate
        self.started = threading.Event()
        self.live: dict[str, tuple[str, int]] = {}
        self.aborted: list[str] = []
        self.added: list[str] = []
        self.sleeps: list[str] = []
        self.steps = 0

    def add_request(self, request_id: str, prompt: Any, params: Any) -> None:
        assert request_id not in self.live, "vLLM refuses a request id in flight"
        self.live[request_id] = (prompt, 0)
        self.added.append(request_id)

    def step(self) -> list[Any]:
        self.steps += 1
        if self.steps == GATE_STEP:
            self.started.set()
            if self.gate is not None:
                _wait(self.gate, "the scheduler asked the rollout to yield")
        outputs = []
        for request_id, (prompt, made) in list(self.live.items()):
            made += 1
            finished = made == TOKENS
            outputs.append(
                SimpleNamespace(request_id=request_id, finished=finished, text=f"{prompt}:{made}")
            )
            if finished:
                del self.live[request_id]
            else:
                self.live[request_id] = (prompt, made)
        return outputs

    def abort_request(self, request_id: Iterable[str]) -> None:
        for one in request_id:
            self.live.pop(one)
            self.aborted.append(one)

    def sleep(self, level: int = 1) -> None:
        self.sleeps.append(f"sleep{level}")

    def wake_up(self) -> None:
        self.sleeps.append("wake")


@pytest.fixture
def sched() -> Iterator[SchedulerForTests]:
    with SchedulerForTests(groups=[SPEC]) as running:
        yield running


def _client(sched: SchedulerForTests, job: str) -> Client:
    return Client(job=job, group="gpus", scheduler=sched.address, lease_seconds=LEASE)


def _train_when_started(
    sched: SchedulerForTests, engine: StepStandIn, seen: list[tuple[int, int]]
) -> threading.Thread:
    """A trainer job that asks for the group once the rollout is under way; it notes the
    requests in flight and finished when it is granted."""

    def train() -> None:
        assert engine.started.wait(30)
        with _client(sched, "trainer") as trainer, trainer.phase("train"):
            finished = sum(1 for rid in engine.added if rid not in engine.live) - len(
                engine.aborted
            )
            seen.append((len(engine.live), finished))

    thread = threading.Thread(target=train)
    thread.start()
    return thread


def test_a_rollout_with_nobody_waiting_runs_in_one_hold(sched: SchedulerForTests) -> None:
    engine = StepStandIn()
    with _client(sched, "gen") as client:
        rollout = VllmRollout(engine, client, max_in_flight=4)
        outputs = rollout.run(REQUESTS)
    assert {rid: out.text for rid, out in outputs.items()} == EXPECTED
    assert (rollout.early_yields, engine.aborted) == (0, [])


@pytest.mark.parametrize("mode", ["wait", "abort"])
def test_the_sync_rollout_yields_early_to_a_waiting_train(
    sched: SchedulerForTests, mode: str
) -> None:
    seen: list[tuple[int, int]] = []
    with _client(sched, "gen") as client:
        engine = StepStandIn(gate=lambda: client.yield_requested("gpus"))
        rollout = VllmRollout(
            engine, client, mode=mode, max_in_flight=4, sleep_level=1, sleeper=engine
        )  # type: ignore[arg-type]
        trainer = _train_when_started(sched, engine, seen)
        outputs = rollout.run(REQUESTS)
        trainer.join(30)
    assert not trainer.is_alive()
    assert {rid: out.text for rid, out in outputs.items()} == EXPECTED
    assert rollout.early_yields >= 1
    ((in_flight, finished),) = seen
    assert in_flight == 0  # the train never ran beside a request
    assert finished < len(REQUESTS)  # it ran while requests remained
    assert engine.sleeps[:2] == ["sleep1", "wake"]
    if mode == "wait":
        assert engine.aborted == []
        assert rollout.aborted == 0
    else:
        assert engine.aborted, "the requests in flight were aborted"
        assert rollout.aborted == len(engine.aborted)
        assert all(f"{rid}-retry1" in engine.added for rid in engine.aborted)


class StreamStandIn:
    """vLLM's `AsyncLLM` shape: generate (an async iterator), abort."""

    def __init__(self, gate: Callable[[], bool] | None = None) -> None:
        self.gate = gate
        self.started = asyncio.Event()
        self.live: set[str] = set()
        self.aborted: list[str] = []
        self.added: list[str] = []
        self.done: set[str] = set()
        self.tokens = 0

    async def generate(
        self, prompt: Any, sampling_params: Any, request_id: str
    ) -> AsyncIterator[Any]:
        self.live.add(request_id)
        self.added.append(request_id)
        try:
            for made in range(1, TOKENS + 1):
                self.tokens += 1
                if self.tokens == GATE_STEP * 4:
                    self.started.set()
                if self.started.is_set():  # every request waits at the gate, as a step would
                    await self._gate()
                await asyncio.sleep(0)
                if request_id in self.aborted:
                    return
                yield SimpleNamespace(
                    request_id=request_id, finished=made == TOKENS, text=f"{prompt}:{made}"
                )
            self.done.add(request_id)
        finally:
            self.live.discard(request_id)

    async def _gate(self) -> None:
        """Once: hold every request until the job is asked to yield."""
        give_up = time.monotonic() + 30
        while self.gate is not None and not self.gate():
            assert time.monotonic() < give_up, "never asked to yield"
            await asyncio.sleep(0.01)
        self.gate = None

    async def abort(self, request_id: str | Iterable[str]) -> None:
        self.aborted.extend([request_id] if isinstance(request_id, str) else request_id)


@pytest.mark.parametrize("mode", ["wait", "abort"])
async def test_the_async_rollout_yields_early_to_a_waiting_train(mode: str) -> None:
    seen: list[int] = []
    async with (
        scheduler_for_tests(groups=[SPEC]) as sched,
        AsyncClient(
            job="gen", group="gpus", scheduler=sched.address, lease_seconds=LEASE
        ) as client,
        AsyncClient(
            job="trainer", group="gpus", scheduler=sched.address, lease_seconds=LEASE
        ) as trainer,
    ):
        # Open once the job is asked (wait) or the train had its turn (abort cancels the
        # requests held at the gate before they see the request).
        engine = StreamStandIn(gate=lambda: client.yield_requested("gpus") or bool(seen))
        rollout = AsyncVllmRollout(engine, client, mode=mode, max_in_flight=4)  # type: ignore[arg-type]

        async def train() -> None:
            await asyncio.wait_for(engine.started.wait(), 30)
            async with trainer.phase("train"):
                seen.append(len(engine.live))

        training = asyncio.create_task(train())
        outputs = await asyncio.wait_for(rollout.run(REQUESTS), 60)
        await asyncio.wait_for(training, 30)
    assert {rid: out.text for rid, out in outputs.items()} == EXPECTED
    assert rollout.early_yields >= 1
    assert seen == [0]  # the train never ran beside a request
    if mode == "wait":
        assert engine.aborted == []
    else:
        assert engine.aborted
        assert rollout.aborted == len(engine.aborted)
        assert all(f"{rid}-retry1" in engine.added for rid in engine.aborted)


def test_bad_arguments_are_refused() -> None:
    engine = StepStandIn()
    client = Client()  # disabled: nothing is called
    with pytest.raises(InvalidArgumentError, match="mode"):
        VllmRollout(engine, client, mode="drop")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="max_in_flight"):
        VllmRollout(engine, client, max_in_flight=0)
    with pytest.raises(InvalidArgumentError, match="sleep_level"):
        VllmRollout(engine, client, sleep_level=1)
    with pytest.raises(InvalidArgumentError, match="unique"):
        VllmRollout(engine, client).run([("a", "p", 1), ("a", "q", 1)])


def test_a_disabled_client_runs_the_rollout_straight_through() -> None:
    engine = StepStandIn()
    rollout = VllmRollout(engine, Client(), max_in_flight=5)
    outputs = rollout.run(REQUESTS)
    assert {rid: out.text for rid, out in outputs.items()} == EXPECTED
    assert rollout.early_yields == 0
