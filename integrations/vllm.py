"""A vLLM rollout that gives the GPUs up early when a training step waits.

```python
from vllm import LLM, SamplingParams
from rlslice import Client
from rlslice.integrations.vllm import VllmRollout

llm = LLM(model="...", enable_sleep_mode=True)
with Client() as client:  # RLSLICE_SCHEDULER, RLSLICE_JOB, RLSLICE_GROUP
    rollout = VllmRollout(llm.llm_engine, client, mode="wait")
    outputs = rollout.run((f"req-{i}", prompt, SamplingParams(max_tokens=256))
                          for i, prompt in enumerate(prompts))
```

`run(requests)` generates every `(request_id, prompt, sampling_params)` inside
`client.phase("rollout")` and returns the final output of each, by request id. The group
should declare the phase's kind (`phases: {rollout: {kind: rollout}}`, docs/scheduler.md):
then, while another job's `train` phase is the next waiter, the scheduler asks this job to
yield (`phase.should_yield()`) and the rollout gives the group up at its next safe point:

- `mode="wait"`: admit no new request, let the ones in flight finish, then yield;
- `mode="abort"`: abort the requests in flight (`abort_request` / `abort`) and yield now;
  they run again from the start at the next grant (vLLM keeps no partial state to resume).

Then it queues again at once (`acquire` waits for the train's turn to end) and carries on
with what is left; `early_yields` counts the times. A request is never cut half-way in
`wait` mode, and the job never runs the engine without the group. With `sleep_level` set
the engine sleeps (`sleep(level)`: level 1 offloads the weights and drops the KV cache)
before each early yield and wakes (`wake_up()`) after the next grant; leave it unset with
the `app` backend, whose agent already sleeps and wakes vLLM on a switch.

Written against vLLM's public engine API, and only that: the sync `LLMEngine`
(`llm.llm_engine`: `add_request(request_id, prompt, params)`, `step()` returning
`RequestOutput`s with `request_id` and `finished`, `abort_request(ids)`, and `LLM`'s or the
engine's `sleep(level)` / `wake_up()`), and `AsyncLLM` / `AsyncLLMEngine` (`generate(prompt,
sampling_params, request_id)`, an async iterator of `RequestOutput`s; `abort(request_id)`;
`sleep`; `wake_up`). vLLM itself is not imported here and cannot run in this project's CI:
the tests (tests/integrations/test_vllm.py) drive this module with small stand-in engines
that keep that API's shape, against a real scheduler. Do not call `run` inside another phase
of the same group (the phase would not yield).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from rlslice._errors import InvalidArgumentError
from rlslice._ids import validate_id
from rlslice.client import AsyncClient, Client, validate_phase

__all__ = ["AsyncVllmRollout", "StepEngine", "StreamEngine", "VllmRollout"]

log = logging.getLogger("rlslice.integrations.vllm")

Mode = Literal["wait", "abort"]
Request = tuple[str, Any, Any]
"""(request_id, prompt, sampling_params), as vLLM takes them."""


class StepEngine(Protocol):
    """What `VllmRollout` calls: vLLM's sync `LLMEngine` (`LLM(...).llm_engine`)."""

    def add_request(self, request_id: str, prompt: Any, params: Any) -> Any: ...

    def step(self) -> list[Any]: ...

    def abort_request(self, request_id: Iterable[str]) -> Any: ...


class StreamEngine(Protocol):
    """What `AsyncVllmRollout` calls: vLLM's `AsyncLLM` / `AsyncLLMEngine`."""

    def generate(self, prompt: Any, sampling_params: Any, request_id: str) -> Any: ...

    def abort(self, request_id: str | Iterable[str]) -> Awaitable[Any]: ...


class Sleeper(Protocol):
    """vLLM's sleep mode (`LLM`, `LLMEngine`, `AsyncLLM`); the async ones return awaitables."""

    def sleep(self, level: int = 1) -> Any: ...

    def wake_up(self) -> Any: ...


@dataclass
class _Work:
    """The requests of one `run`: what is left, what runs, what is done."""

    pending: deque[Request]
    running: dict[str, Request] = field(default_factory=dict)
    """Engine request id -> the request (ids are fresh per attempt after an abort)."""
    done: dict[str, Any] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)

    def engine_id(self, request: Request) -> str:
        attempt = self.attempts.get(request[0], 0)
        self.attempts[request[0]] = attempt + 1
        return request[0] if attempt == 0 else f"{request[0]}-retry{attempt}"

    def requeue_running(self) -> list[str]:
        """Put every running request back at the front (in order); their engine ids."""
        ids = list(self.running)
        self.pending.extendleft(reversed(list(self.running.values())))
        self.running.clear()
        return ids

    @property
    def left(self) -> bool:
        return bool(self.pending or self.running)


class _Rollout:
    def __init__(
        self,
        *,
        mode: Mode,
        phase: str,
        group: str | None,
        max_in_flight: int,
        sleep_level: int | None,
        sleeper: Sleeper | None,
    ) -> None:
        if mode not in ("wait", "abort"):
            raise InvalidArgumentError(f"mode: {mode!r} is not 'wait' or 'abort'")
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int):
            raise InvalidArgumentError(f"max_in_flight: {max_in_flight!r} is not a whole number")
        if max_in_flight < 1:
            raise InvalidArgumentError(f"max_in_flight: {max_in_flight} is below 1")
        if sleep_level is not None and sleeper is None:
            raise InvalidArgumentError("sleep_level: needs an engine with sleep() and wake_up()")
        self.mode: Mode = mode
        self.phase = validate_phase(phase)
        self.group = None if group is None else validate_id(group, "group")
        self.max_in_flight = max_in_flight
        self.sleep_level = sleep_level
        self._sleeper = sleeper
        self.early_yields = 0
        """How many times `run` gave the group up because the scheduler asked."""
        self.aborted = 0
        """Requests aborted (mode="abort") to yield; each ran again later."""

    @staticmethod
    def _work(requests: Iterable[Request]) -> _Work:
        work = _Work(deque(requests))
        ids = [r[0] for r in work.pending]
        if len(set(ids)) != len(ids):
            raise InvalidArgumentError("requests: request ids must be unique")
        return work


class VllmRollout(_Rollout):
    """Run requests through a sync vLLM engine inside the rollout phase; yield early
    (`mode="wait"` or `"abort"`) when the scheduler asks. See the module doc."""

    def __init__(
        self,
        engine: StepEngine,
        client: Client,
        *,
        mode: Mode = "wait",
        phase: str = "rollout",
        group: str | None = None,
        max_in_flight: int = 256,
        sleep_level: int | None = None,
        sleeper: Sleeper | None = None,
    ) -> None:
        """`sleeper`: what `sleep`/`wake_up` are called on when `sleep_level` is set (the
        `LLM`, or the engine itself)."""
        super().__init__(
            mode=mode,
            phase=phase,
            group=group,
            max_in_flight=max_in_flight,
            sleep_level=sleep_level,
            sleeper=sleeper,
        )
        self.engine = engine
        self.client = client

    def run(self, requests: Iterable[Request]) -> dict[str, Any]:
        """Generate every request; the final `RequestOutput` of each, by request id."""
        work = self._work(requests)
        asleep = False
        while work.left:
            phase = self.client.phase(self.phase, self.group)
            with phase:
                if asleep and self._sleeper is not None:
                    self._sleeper.wake_up()
                    asleep = False
                if self._hold(phase, work):
                    return work.done
                self.early_yields += 1
                if self.sleep_level is not None and self._sleeper is not None:
                    self._sleeper.sleep(self.sleep_level)
                    asleep = True
                log.info(
                    "rollout yields early (%s): %d requests left", self.mode, len(work.pending)
                )
        return work.done

    def _hold(self, phase: Any, work: _Work) -> bool:
        """Step the engine while holding; True when everything is done, False to yield."""
        while work.left:
            asked = phase.should_yield()
            if asked and (self.mode == "abort" or not work.running):
                if work.running:
                    ids = work.requeue_running()
                    self.engine.abort_request(ids)
                    self.aborted += len(ids)
                return False
            while not asked and work.pending and len(work.running) < self.max_in_flight:
                request = work.pending.popleft()
                engine_id = work.engine_id(request)
                self.engine.add_request(engine_id, request[1], request[2])
                work.running[engine_id] = request
            for output in self.engine.step():
                ran = work.running.get(output.request_id)
                if ran is not None and output.finished:
                    del work.running[output.request_id]
                    work.done[ran[0]] = output
        return True


class AsyncVllmRollout(_Rollout):
    """`VllmRollout` for vLLM's `AsyncLLM` / `AsyncLLMEngine` and an `AsyncClient`: the
    requests in flight run concurrently, and the scheduler's request is awaited
    (`phase.wait_should_yield()`) rather than polled."""

    def __init__(
        self,
        engine: StreamEngine,
        client: AsyncClient,
        *,
        mode: Mode = "wait",
        phase: str = "rollout",
        group: str | None = None,
        max_in_flight: int = 256,
        sleep_level: int | None = None,
        sleeper: Sleeper | None = None,
    ) -> None:
        super().__init__(
            mode=mode,
            phase=phase,
            group=group,
            max_in_flight=max_in_flight,
            sleep_level=sleep_level,
            sleeper=sleeper,
        )
        self.engine = engine
        self.client = client

    async def run(self, requests: Iterable[Request]) -> dict[str, Any]:
        """Generate every request; the final `RequestOutput` of each, by request id."""
        work = self._work(requests)
        asleep = False
        while work.left:
            phase = self.client.phase(self.phase, self.group)
            async with phase:
                if asleep and self._sleeper is not None:
                    await self._sleeper.wake_up()
                    asleep = False
                if await self._hold(phase, work):
                    return work.done
                self.early_yields += 1
                if self.sleep_level is not None and self._sleeper is not None:
                    await self._sleeper.sleep(self.sleep_level)
                    asleep = True
        return work.done

    async def _final(self, request: Request, engine_id: str) -> Any:
        final = None
        async for output in self.engine.generate(request[1], request[2], engine_id):
            final = output
        return final

    async def _hold(self, phase: Any, work: _Work) -> bool:
        asked: asyncio.Task[bool] = asyncio.create_task(phase.wait_should_yield())
        tasks: dict[asyncio.Task[Any], str] = {}
        try:
            while work.left:
                while not asked.done() and work.pending and len(tasks) < self.max_in_flight:
                    request = work.pending.popleft()
                    engine_id = work.engine_id(request)
                    work.running[engine_id] = request
                    tasks[asyncio.create_task(self._final(request, engine_id))] = engine_id
                if asked.done() and (self.mode == "abort" or not tasks):
                    if tasks:
                        ids = work.requeue_running()
                        await self.engine.abort(ids)
                        self.aborted += len(ids)
                    return False
                waits: set[asyncio.Task[Any]] = set(tasks)
                if not asked.done():
                    waits.add(asked)
                finished, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                for task in finished:
                    if task is asked:
                        continue
                    engine_id = tasks.pop(task)
                    request = work.running.pop(engine_id)
                    work.done[request[0]] = task.result()
            return True
        finally:
            asked.cancel()
            for task in tasks:  # aborted (or the caller cancelled): stop consuming them
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
