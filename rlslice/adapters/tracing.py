"""OpenTelemetry spans for acquire, switch, snapshot and restore; a no-op without OpenTelemetry.

    from rlslice.adapters.tracing import ACQUIRE, span

    with span(ACQUIRE, group="g", job="a") as s:          # or: async with span(...)
        grant = await stub.Acquire(request)
        s.set(epoch=grant.epoch, waited_seconds=grant.waited_seconds)

Keyword attributes become `rlslice.<key>` span attributes (`group="g"` -> `rlslice.group`);
None values are left out. When `opentelemetry-api` is importable (`pip install
rlslice[tracing]`), spans go to the global tracer provider the application configured
(none configured: OpenTelemetry's own no-op). When it is not importable, `span()` returns a
shared do-nothing object: no import error, about the cost of a function call.

Span names and the attributes callers set (docs/observability.md keeps the same table):

| span | where | attributes |
|---|---|---|
| `rlslice.acquire` | client, around one Acquire call | group, job, phase; at the end epoch, waited_seconds, switch_seconds, moved_bytes, restored |
| `rlslice.switch` | scheduler coordinator, one switch | group, epoch, outgoing, incoming, nodes; at the end seconds, bytes, outcome |
| `rlslice.snapshot` | agent, one Snapshot on one node | group, job, epoch, node, backend; at the end seconds, bytes |
| `rlslice.restore` | agent, one Restore on one node | group, job, epoch, node, backend; at the end seconds, bytes |

A span that ends by an exception records it and gets status ERROR (OpenTelemetry's default).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Final

from rlslice._version import __version__

ACQUIRE: Final = "rlslice.acquire"
SWITCH: Final = "rlslice.switch"
SNAPSHOT: Final = "rlslice.snapshot"
RESTORE: Final = "rlslice.restore"
#: Every span name rlslice emits.
SPAN_NAMES: Final = (ACQUIRE, SWITCH, SNAPSHOT, RESTORE)
#: Prefix of every attribute key.
ATTRIBUTE_PREFIX: Final = "rlslice."

AttributeValue = str | bool | int | float | Sequence[str] | Sequence[int] | Sequence[float]

_UNSET: Final = object()
_tracer: Any = _UNSET  # an OpenTelemetry Tracer, None (not installed), or _UNSET (not looked)


def attributes(values: Mapping[str, AttributeValue | None]) -> dict[str, Any]:
    """`{"group": "g"}` -> `{"rlslice.group": "g"}`, leaving out None values."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if value is None:
            continue
        out[ATTRIBUTE_PREFIX + key] = list(value) if isinstance(value, tuple) else value
    return out


class NoopSpan:
    """What `span()` gives when OpenTelemetry is not installed: does nothing, sync or async."""

    __slots__ = ()

    def set(self, **values: AttributeValue | None) -> None:
        """Ignored."""

    def __enter__(self) -> NoopSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    async def __aenter__(self) -> NoopSpan:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


NOOP_SPAN: Final = NoopSpan()


class OtelSpan:
    """A span of the configured OpenTelemetry tracer, current while the block runs."""

    __slots__ = ("_attributes", "_manager", "_name", "_span", "_tracer")

    def __init__(self, tracer: Any, name: str, values: Mapping[str, Any]) -> None:
        self._tracer = tracer
        self._name = name
        self._attributes = values
        self._manager: Any = None
        self._span: Any = None

    def set(self, **values: AttributeValue | None) -> None:
        """Add attributes (results known only at the end: bytes, seconds, epoch)."""
        if self._span is not None:
            self._span.set_attributes(attributes(values))

    def __enter__(self) -> OtelSpan:
        self._manager = self._tracer.start_as_current_span(self._name, attributes=self._attributes)
        self._span = self._manager.__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        manager, self._manager, self._span = self._manager, None, None
        manager.__exit__(kind, value, traceback)

    async def __aenter__(self) -> OtelSpan:
        return self.__enter__()

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.__exit__(kind, value, traceback)


def span(name: str, **values: AttributeValue | None) -> NoopSpan | OtelSpan:
    """A span named `name` (use `with` or `async with`); a shared no-op without OpenTelemetry."""
    tracer = _tracer if _tracer is not _UNSET else _find_tracer()
    if tracer is None:
        return NOOP_SPAN
    return OtelSpan(tracer, name, attributes(values))


def enabled() -> bool:
    """Whether spans go to OpenTelemetry."""
    return (_tracer if _tracer is not _UNSET else _find_tracer()) is not None


def use(tracer_provider: Any) -> None:
    """Send rlslice's spans to `tracer_provider` instead of the global one (tests, embedding)."""
    global _tracer
    _tracer = tracer_provider.get_tracer("rlslice", __version__)


def reset() -> None:
    """Forget the tracer; the next `span()` looks for OpenTelemetry again."""
    global _tracer
    _tracer = _UNSET


def _find_tracer() -> Any:
    global _tracer
    try:
        from opentelemetry import trace
    except ImportError:
        _tracer = None
    else:
        # A proxy: spans reach whatever provider the application sets, even later.
        _tracer = trace.get_tracer("rlslice", __version__)
    return _tracer
