"""GroupState <-> plain JSON-able dicts, for every store (SQLite rows, Kubernetes objects).

Versioned by `SCHEMA_VERSION`; `decode_group` refuses a newer version rather than guess.
Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

from rlslice.config import GroupSpec
from rlslice.scheduler.core import GroupState, JobRecord, Switch, Waiter

#: Bump when the encoded shape changes incompatibly.
SCHEMA_VERSION = 1


_JOB_FIELDS = JobRecord.__slots__
_WAITER_FIELDS = Waiter.__slots__
_SWITCH_FIELDS = Switch.__slots__
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


def encode_group(state: GroupState) -> dict[str, Any]:
    """A JSON-able dict holding everything needed to rebuild `state`. Called after every
    accepted event, so it avoids `dataclasses.asdict` (which deep-copies)."""
    return {
        "v": SCHEMA_VERSION,
        "spec": _encode_spec(state.spec),
        "jobs": [_fields(record, _JOB_FIELDS) for record in state.jobs.values()],
        "holder": state.holder,
        "holder_since": state.holder_since,
        "queue": [_fields(w, _WAITER_FIELDS) for w in state.queue],
        "resident": list(state.resident),
        "parked": list(state.parked),
        "faulted": dict(state.faulted),
        "epoch": state.epoch,
        "switch": _encode_switch(state.switch),
        "yield_requested_at": state.yield_requested_at,
        "preempted": sorted(state.preempted),
        "switches": state.switches,
        "last_switch_seconds": state.last_switch_seconds,
        "last_switch_at": state.last_switch_at,
        "fencing": list(state.fencing),
        "prefetched": list(state.prefetched),
        "unfit": list(state.unfit) if state.unfit is not None else None,
        "acknowledged": list(state.acknowledged) if state.acknowledged is not None else None,
    }


def _encode_switch(switch: Switch | None) -> dict[str, Any] | None:
    if switch is None:
        return None
    data = _fields(switch, _SWITCH_FIELDS)
    data["evict"] = list(switch.evict)
    data["candidates"] = list(switch.candidates)
    data["fence"] = list(switch.fence)
    return data


def decode_group(data: dict[str, Any]) -> GroupState:
    """Rebuild a state from `encode_group`'s output. Raises ValueError on a newer schema."""
    version = data.get("v")
    if version != SCHEMA_VERSION:
        raise ValueError(f"stored group has schema version {version}, this build reads 1")
    switch = data["switch"]
    return GroupState(
        spec=GroupSpec.model_validate(data["spec"]),
        jobs={j["name"]: JobRecord(**j) for j in data["jobs"]},
        holder=data["holder"],
        holder_since=data["holder_since"],
        queue=tuple(Waiter(**w) for w in data["queue"]),
        resident=tuple(data["resident"]),
        parked=tuple(data["parked"]),
        faulted=dict(data["faulted"]),
        epoch=data["epoch"],
        switch=None
        if switch is None
        else Switch(
            **{
                **switch,
                "evict": tuple(switch["evict"]),
                "candidates": tuple(switch["candidates"]),
                "fence": tuple(switch.get("fence", ())),
            }
        ),
        yield_requested_at=data["yield_requested_at"],
        preempted=frozenset(data["preempted"]),
        switches=data["switches"],
        last_switch_seconds=data["last_switch_seconds"],
        last_switch_at=data["last_switch_at"],
        fencing=tuple(data.get("fencing", ())),
        prefetched=tuple(data.get("prefetched", ())),
        unfit=_pair(data.get("unfit")),
        acknowledged=_acknowledged(data.get("acknowledged")),
    )


def _pair(value: Any) -> tuple[str, str] | None:
    return (str(value[0]), str(value[1])) if value else None


def _acknowledged(value: Any) -> tuple[str, int] | None:
    return (str(value[0]), int(value[1])) if value else None
