"""GroupState <-> plain JSON-able dicts, for every store (SQLite rows, Kubernetes objects).

Versioned by `SCHEMA_VERSION`; `decode_group` refuses a newer version rather than guess,
and reads the older ones (schema 1 stored `placement` as its three views).
Every field of `GroupState`, `JobRecord`, `Waiter` and `Switch` is carried: the field
lists come from the classes themselves (their slots), and a `GroupState` field this module
does not say how to encode fails at import, so a new field cannot be dropped unseen.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlslice.config import GroupSpec
from rlslice.scheduler.core import GroupState, JobRecord, Switch, SwitchKind, Waiter
from rlslice.scheduler.core.placement import Location, PlacementMap, place

#: Bump when the encoded shape changes incompatibly (and read the older shape in
#: `decode_group`). 2: `placement` is a list of {job, where, reason}.
SCHEMA_VERSION = 2


_JOB_FIELDS = JobRecord.__slots__
_WAITER_FIELDS = Waiter.__slots__
_SWITCH_FIELDS = Switch.__slots__
_SWITCH_TUPLES = ("evict", "candidates", "fence")
#: JobRecord fields that are tuples (stored as lists; absent in records stored before them).
_JOB_TUPLES = ("discarded", "told_discarded", "parked_parts")
# The spec changes rarely: keep its encoding per group, reused while the object is the same.
_spec_cache: dict[str, tuple[GroupSpec, dict[str, Any]]] = {}


def _fields(obj: object, names: tuple[str, ...]) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in names}


def _encode_spec(spec: GroupSpec) -> dict[str, Any]:
    cached = _spec_cache.get(spec.name)
    if cached is not None and cached[0] is spec:
        return cached[1]
    encoded = spec.model_dump(mode="json")
    _spec_cache[spec.name] = (spec, encoded)
    return encoded


def _encode_switch(switch: Switch | None) -> dict[str, Any] | None:
    if switch is None:
        return None
    data = _fields(switch, _SWITCH_FIELDS)
    data["purpose"] = switch.purpose.value
    for name in _SWITCH_TUPLES:
        data[name] = list(data[name])
    return data


def _decode_job(data: dict[str, Any]) -> JobRecord:
    tuples = {name: tuple(data.get(name, ())) for name in _JOB_TUPLES}
    return JobRecord(**{**data, **tuples})


def _encode_job(record: JobRecord) -> dict[str, Any]:
    data = _fields(record, _JOB_FIELDS)
    for name in _JOB_TUPLES:
        data[name] = list(data[name])
    return data


def _decode_switch(data: dict[str, Any] | None) -> Switch | None:
    if data is None:
        return None
    tuples = {name: tuple(data.get(name, ())) for name in _SWITCH_TUPLES}
    return Switch(**{**data, **tuples, "purpose": SwitchKind(data.get("purpose", "grant"))})


_RESIDENT, _PARKED, _FAULTED = (
    w.value for w in (Location.RESIDENT, Location.PARKED, Location.FAULTED)
)


def _encode_placement(placement: PlacementMap) -> list[dict[str, str]]:
    """Each placed job as {job, where, reason}: resident (least recently used first), then
    parked (first parked first), then faulted (first faulted first)."""
    out = [{"job": j, "where": _RESIDENT, "reason": ""} for j in placement.resident]
    out += [{"job": j, "where": _PARKED, "reason": ""} for j in placement.parked]
    out += [{"job": j, "where": _FAULTED, "reason": r} for j, r in placement.faulted.items()]
    return out


def _decode_placement(data: list[dict[str, str]]) -> PlacementMap:
    by_kind: dict[str, list[dict[str, str]]] = {_RESIDENT: [], _PARKED: [], _FAULTED: []}
    for entry in data:
        by_kind[entry["where"]].append(entry)
    return place(
        (e["job"] for e in by_kind[_RESIDENT]),
        (e["job"] for e in by_kind[_PARKED]),
        {e["job"]: e["reason"] for e in by_kind[_FAULTED]},
    )


def _pair(value: Any) -> tuple[str, str] | None:
    return (str(value[0]), str(value[1])) if value else None


def _acknowledged(value: Any) -> tuple[str, int] | None:
    return (str(value[0]), int(value[1])) if value else None


#: Fields stored as they are (numbers, strings, None).
_PLAIN = (
    "holder",
    "holder_since",
    "epoch",
    "yield_requested_at",
    "switches",
    "last_switch_seconds",
    "last_switch_at",
)
#: Fields stored converted (tuples as lists, records as dicts): name -> how to decode.
_DECODE: dict[str, Callable[[Any], Any]] = {
    "spec": GroupSpec.model_validate,
    "jobs": lambda jobs: {j["name"]: _decode_job(j) for j in jobs},
    "queue": lambda queue: tuple(Waiter(**w) for w in queue),
    "placement": _decode_placement,
    "switch": _decode_switch,
    "preempted": frozenset,
    "fencing": tuple,
    "prefetched": tuple,
    "unfit": _pair,
    "acknowledged": _acknowledged,
}

_covered = {*_PLAIN, *_DECODE}
if _covered != set(GroupState.__slots__):
    raise TypeError(  # pragma: no cover - a developer's mistake, caught by any import
        "store codec and GroupState disagree on fields: "
        f"{sorted(_covered.symmetric_difference(GroupState.__slots__))}"
    )
#: Fields newer than schema 1's first data: name -> the value when a stored group lacks it.
_ADDED_LATER: dict[str, Any] = {
    "fencing": (),
    "prefetched": (),
    "unfit": None,
    "acknowledged": None,
}


def encode_group(state: GroupState) -> dict[str, Any]:
    """A JSON-able dict holding everything needed to rebuild `state`. Called after every
    accepted event, so it avoids `dataclasses.asdict` (which deep-copies) and is spelled
    out rather than looped over `_PLAIN` and `_DECODE` (a third faster); the check
    below this function holds it to those lists."""
    unfit, acknowledged = state.unfit, state.acknowledged
    return {
        "v": SCHEMA_VERSION,
        "spec": _encode_spec(state.spec),
        "jobs": [_encode_job(record) for record in state.jobs.values()],
        "holder": state.holder,
        "holder_since": state.holder_since,
        "queue": [_fields(w, _WAITER_FIELDS) for w in state.queue],
        "placement": _encode_placement(state.placement),
        "epoch": state.epoch,
        "switch": _encode_switch(state.switch),
        "yield_requested_at": state.yield_requested_at,
        "preempted": sorted(state.preempted),
        "switches": state.switches,
        "last_switch_seconds": state.last_switch_seconds,
        "last_switch_at": state.last_switch_at,
        "fencing": list(state.fencing),
        "prefetched": list(state.prefetched),
        "unfit": None if unfit is None else list(unfit),
        "acknowledged": None if acknowledged is None else list(acknowledged),
    }


_encoded = set(encode_group(GroupState(GroupSpec(name="codec-check"))))
if _encoded != {"v", *_PLAIN, *_DECODE}:
    raise TypeError(  # pragma: no cover - a developer's mistake, caught by any import
        f"encode_group and the codec's field lists disagree: {sorted(_encoded)}"
    )


def decode_group(data: dict[str, Any]) -> GroupState:
    """Rebuild a state from `encode_group`'s output, of this schema or an older one.
    Raises ValueError on a newer schema."""
    version = data.get("v")
    if version == 1:
        data = _from_schema_1(data)
    elif version != SCHEMA_VERSION:
        raise ValueError(
            f"stored group has schema version {version}, this build reads 1 to {SCHEMA_VERSION}"
        )
    values: dict[str, Any] = {name: data[name] for name in _PLAIN}
    for name, decode in _DECODE.items():
        stored = data.get(name)
        if stored is None and name in _ADDED_LATER:
            values[name] = _ADDED_LATER[name]
        else:
            values[name] = decode(data[name])
    return GroupState(**values)


def _from_schema_1(data: dict[str, Any]) -> dict[str, Any]:
    """A schema 1 group in this schema's shape: its three placement views (`resident`,
    `parked`, `faulted`) become the one `placement` list, placed as schema 1 read them."""
    old = dict(data)
    views = place(old.pop("resident"), old.pop("parked"), dict(old.pop("faulted")))
    old["placement"] = _encode_placement(views)
    return old
