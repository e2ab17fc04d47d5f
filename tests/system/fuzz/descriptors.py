"""Hypothesis strategies built from protobuf descriptors: any message, any field.

`messages(descriptor, pools)` draws a message of that type with every field random or
boundary-valued: strings (unicode, empty, long, the live ids in `pools`), integers at their
type's bounds, floats with NaN and infinities, unknown enum numbers, bytes, repeated
fields and maps up to 40 entries, nested messages two levels deep. Nothing is written per
RPC: a method added to a service is fuzzed from its descriptor the day it ships.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import strategies as st

_BOUNDS = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
_FLOATS = (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT)


def _text(pool: Sequence[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(list(pool) or ["a"]),
        st.text(max_size=80),
        st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-\n", min_size=1, max_size=70),
        st.sampled_from(["", "-a", "A", "a" * 64, "a" * 70_000, "ä", "g\n", "g\x00", "../x"]),
    )


def _integer(low: int, high: int) -> st.SearchStrategy[int]:
    return st.one_of(
        st.sampled_from(
            sorted({low, high, 0, 1, max(low, -1), 2**31 - 1 if high > 2**31 else high})
        ),
        st.integers(min_value=low, max_value=high),
    )


def _repeated(field: FieldDescriptor) -> bool:
    repeated = getattr(field, "is_repeated", None)  # newer protobuf; `label` is deprecated
    if isinstance(repeated, bool):
        return repeated
    return bool(field.label == FieldDescriptor.LABEL_REPEATED)


def _scalar(field: FieldDescriptor, pool: Sequence[str]) -> st.SearchStrategy[Any]:
    kind = field.type
    if kind == FieldDescriptor.TYPE_STRING:
        return _text(pool)
    if kind == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind in _FLOATS:
        width = 32 if kind == FieldDescriptor.TYPE_FLOAT else 64
        return st.one_of(
            st.floats(allow_nan=True, allow_infinity=True, width=width),
            st.sampled_from([0.0, -1.0, 1e-300 if width == 64 else 1e-30, 3600.0]),
        )
    if kind == FieldDescriptor.TYPE_ENUM:
        known = [value.number for value in field.enum_type.values]
        return st.one_of(st.sampled_from(known), st.integers(-5, 1000))
    low, high = _BOUNDS[kind]
    return _integer(low, high)


def messages(
    descriptor: Descriptor, pools: Mapping[str, Sequence[str]], depth: int = 2
) -> st.SearchStrategy[Message]:
    """A strategy of `descriptor`'s messages; `pools` offers real values by field name."""
    cls = GetMessageClass(descriptor)
    parts: dict[str, st.SearchStrategy[Any]] = {}
    for field in descriptor.fields:
        value = _field(field, pools, depth)
        if value is not None:
            parts[field.name] = st.one_of(st.none(), value)

    def build(values: dict[str, Any]) -> Message:
        message = cls()
        for name, value in values.items():
            if value is None:
                continue
            field = descriptor.fields_by_name[name]
            target = getattr(message, name)
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                for key, item in value.items():
                    if isinstance(item, Message):
                        target[key].CopyFrom(item)
                    else:
                        target[key] = item
            elif _repeated(field):
                if field.message_type is not None:
                    for item in value:
                        target.add().CopyFrom(item)
                else:
                    target.extend(value)
            elif field.message_type is not None:
                target.CopyFrom(value)
            else:
                setattr(message, name, value)
        return message

    return st.fixed_dictionaries({}, optional=parts).map(build)


def _field(
    field: FieldDescriptor, pools: Mapping[str, Sequence[str]], depth: int
) -> st.SearchStrategy[Any] | None:
    pool = pools.get(field.name, ())
    entry = field.message_type
    if entry is not None and entry.GetOptions().map_entry:
        key = _field(entry.fields_by_name["key"], pools, depth)
        value = _field(entry.fields_by_name["value"], pools, depth)
        if key is None or value is None:
            return None
        return st.dictionaries(key, value, max_size=8)
    if entry is not None:
        if depth <= 0:
            return None
        one: st.SearchStrategy[Any] = messages(entry, pools, depth - 1)
    else:
        one = _scalar(field, pool)
    if _repeated(field):
        return st.lists(one, max_size=40)
    return one
