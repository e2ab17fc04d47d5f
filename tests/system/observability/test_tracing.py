"""Tracing hooks: real OpenTelemetry spans when it is installed, a cheap no-op when it is not.

Case matrix:

| OpenTelemetry | use | checked |
|---|---|---|
| SDK with an in-memory exporter | `with` | name, `rlslice.*` attributes, attributes set at the end, None left out |
| SDK | `async with`, nested | parent/child link survives an await |
| SDK | the block raises | the exception propagates; the span has status ERROR and an exception event |
| the global provider (a fresh process) | `span()` with no `use()` | spans reach the provider the application set |
| not importable (sys.modules patched) | `with` / `async with` / `set` | the shared no-op, no import error, exceptions propagate, under a few microseconds |
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from rlslice.adapters import tracing as _tracing
from rlslice.adapters.tracing import ACQUIRE, RESTORE, SNAPSHOT, SPAN_NAMES, SWITCH, span


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    _tracing.use(provider)
    yield memory
    _tracing.reset()


@pytest.fixture
def without_opentelemetry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # A None entry in sys.modules makes `import opentelemetry...` raise ImportError.
    for name in [m for m in sys.modules if m == "opentelemetry" or m.startswith("opentelemetry.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    _tracing.reset()
    yield
    _tracing.reset()


def test_the_span_names_are_the_four_documented_ones() -> None:
    assert SPAN_NAMES == (
        "rlslice.acquire",
        "rlslice.switch",
        "rlslice.snapshot",
        "rlslice.restore",
    )
    assert (ACQUIRE, SWITCH, SNAPSHOT, RESTORE) == SPAN_NAMES


def test_a_span_carries_prefixed_attributes_and_those_set_at_the_end(
    exporter: InMemorySpanExporter,
) -> None:
    with span(ACQUIRE, group="g1", job="a", phase=None) as s:
        s.set(epoch=7, waited_seconds=0.25, restored=True, nodes=("n1", "n2"))
    (finished,) = exporter.get_finished_spans()
    assert finished.name == "rlslice.acquire"
    assert dict(finished.attributes or {}) == {
        "rlslice.group": "g1",
        "rlslice.job": "a",
        "rlslice.epoch": 7,
        "rlslice.waited_seconds": 0.25,
        "rlslice.restored": True,
        "rlslice.nodes": ("n1", "n2"),
    }
    assert _tracing.enabled()


async def test_async_spans_nest_across_awaits(exporter: InMemorySpanExporter) -> None:
    import asyncio

    async with span(SWITCH, group="g1", outgoing="a", incoming="b"):
        await asyncio.sleep(0)
        async with span(SNAPSHOT, group="g1", job="a", node="n1") as inner:
            await asyncio.sleep(0)
            inner.set(bytes=1024, seconds=0.1)
    snapshot, switch = exporter.get_finished_spans()
    assert (snapshot.name, switch.name) == ("rlslice.snapshot", "rlslice.switch")
    assert snapshot.parent is not None
    assert snapshot.parent.span_id == switch.context.span_id
    assert dict(snapshot.attributes or {})["rlslice.bytes"] == 1024


def test_a_failing_block_raises_and_marks_the_span_as_an_error(
    exporter: InMemorySpanExporter,
) -> None:
    with pytest.raises(RuntimeError, match="restore failed"), span(RESTORE, job="b"):
        raise RuntimeError("restore failed")
    (finished,) = exporter.get_finished_spans()
    assert finished.status.status_code is StatusCode.ERROR
    assert [e.name for e in finished.events] == ["exception"]


def test_spans_reach_the_global_provider_the_application_sets(tmp_path: os.PathLike[str]) -> None:
    # A fresh process: the global provider can be set only once per process.
    script = textwrap.dedent(
        """
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from rlslice.adapters.tracing import span
        early = span("rlslice.switch")  # looked up before the provider exists: a proxy
        memory = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(memory))
        trace.set_tracer_provider(provider)
        with early:
            pass
        with span("rlslice.acquire", group="g"):
            pass
        print(",".join(s.name for s in memory.get_finished_spans()))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONSAFEPATH": "1"},
        check=True,
    )
    assert done.stdout.strip() == "rlslice.switch,rlslice.acquire"


def test_without_opentelemetry_span_is_the_shared_no_op(without_opentelemetry: None) -> None:
    with span(ACQUIRE, group="g", job="a") as s:
        s.set(epoch=1)
    assert s is _tracing.NOOP_SPAN
    assert not _tracing.enabled()
    with pytest.raises(KeyError), span(SWITCH):
        raise KeyError("propagates")


async def test_without_opentelemetry_async_spans_work_too(without_opentelemetry: None) -> None:
    async with span(SNAPSHOT, node="n1") as s:
        s.set(bytes=1)
    assert s is _tracing.NOOP_SPAN


def test_without_opentelemetry_a_span_costs_about_a_function_call(
    without_opentelemetry: None,
) -> None:
    rounds = 20_000
    began = time.perf_counter()
    for _ in range(rounds):
        with span(ACQUIRE, group="g", job="a"):
            pass
    per_span = (time.perf_counter() - began) / rounds
    assert per_span < 5e-6, f"{per_span * 1e6:.2f} µs per no-op span"
