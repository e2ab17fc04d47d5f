"""Convert a TimeSliceGroup resource into the scheduler's `GroupSpec`. Pure.

The CRD's schema already bounds every field; this conversion re-validates through the
shared pydantic model, so a spec that slipped past the API server (an older CRD, a client
without field validation) fails here with a message naming the field, before any call.

The resource follows the API conventions; the scheduler's wire form is unchanged:
integer `...Seconds` and weights become the model's floats; `headroom` (a quantity: 2Gi,
500M, bytes) becomes `headroom_bytes`; each job's `parts` (issue 26: `tag`, `bytes` a
quantity, `moveClass` discard/offload/keepIfRoom, `needOrder`) become its `StatePart`s,
`keepIfRoom` the model's `keep_if_room`; `nodeSelector` (a label selector) becomes the
scheduler's label map: `matchLabels`, plus `matchExpressions` of operator In with one
value (the scheduler matches label equality; other requirements are refused with a
message naming them rather than widened into a group of more nodes).
`namespaces` and `namespaceSelector` stay in the resource: the webhook applies them
(`rlslice.operator.access`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from pydantic import ValidationError

from rlslice._errors import InvalidArgumentError
from rlslice.config import GroupSpec, JobSpec, MoveClass, StatePart, first_error

#: API group, version and plural of the resource.
GROUP = "rlslice.dev"
VERSION = "v1alpha1"
PLURAL = "timeslicegroups"

#: The CRD's defaults, applied when the API server did not (a missing or older CRD).
DEFAULT_BACKEND = "cuda"

#: The CRD's spelling of each move class of a state part (API conventions: camelCase).
MOVE_CLASSES = {
    "discard": MoveClass.DISCARD,
    "offload": MoveClass.OFFLOAD,
    "keepIfRoom": MoveClass.KEEP_IF_ROOM,
}
#: Bounds of the wire form (`StatePart.bytes` is an int64, `need_order` an int32).
MAX_PART_BYTES = 2**63 - 1
MAX_NEED_ORDER = 2**31 - 1

_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
_FACTORS = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


def parse_quantity(value: object, field: str) -> int:
    """Bytes of a Kubernetes quantity (`2Gi`, `1.5G`, `500M`, `1024`), rounded up."""
    if isinstance(value, bool):
        raise InvalidArgumentError(f"{field}: {value!r} is not a quantity")
    if isinstance(value, int):
        if value < 0:
            raise InvalidArgumentError(f"{field}: {value} is negative")
        return value
    match = _QUANTITY.fullmatch(str(value).strip())
    if match is None:
        raise InvalidArgumentError(
            f"{field}: {value!r} is not a quantity (like 2Gi, 500M or a number of bytes)"
        )
    try:
        number = Decimal(match.group(1))
    except InvalidOperation:  # pragma: no cover - the pattern admits decimals only
        raise InvalidArgumentError(f"{field}: {value!r} is not a quantity") from None
    return math.ceil(number * _FACTORS[match.group(2) or ""])


def node_labels(selector: Mapping[str, Any] | None) -> dict[str, str]:
    """The label map the scheduler matches, from the label selector `spec.nodeSelector`."""
    if not selector:
        return {}
    labels = {str(k): str(v) for k, v in (selector.get("matchLabels") or {}).items()}
    for index, item in enumerate(selector.get("matchExpressions") or ()):
        where = f"spec.nodeSelector.matchExpressions[{index}]"
        values = list(item.get("values") or ())
        if item.get("operator") != "In" or len(values) != 1:
            raise InvalidArgumentError(
                f"{where}: only operator In with one value is supported for nodes (the "
                f"scheduler matches node labels by equality); got {item.get('operator')} "
                f"{values}"
            )
        key = str(item.get("key", ""))
        if labels.get(key, values[0]) != values[0]:
            raise InvalidArgumentError(f"{where}: {key} contradicts matchLabels")
        labels[key] = str(values[0])
    return labels


def _integer(spec: Mapping[str, Any], key: str, default: int) -> float:
    value = spec.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"spec.{key}: {value!r} is not a whole number of seconds")
    return float(value)


def group_spec(name: str, spec: Mapping[str, Any]) -> GroupSpec:
    """The scheduler spec of the TimeSliceGroup `name` with `spec` (the resource's `.spec`).

    Raises InvalidArgumentError naming the first bad field (`spec.jobs[1].name: ...`).
    """
    jobs = tuple(_job(index, job) for index, job in enumerate(spec.get("jobs") or ()))
    _unique_jobs(jobs)
    try:
        return GroupSpec(
            name=name,
            policy=spec.get("policy", "fifo"),
            lease_seconds=_integer(spec, "leaseSeconds", 30),
            max_hold_seconds=_integer(spec, "maxHoldSeconds", 0),
            yield_grace_seconds=_integer(spec, "yieldGraceSeconds", 10),
            backend=spec.get("backend", DEFAULT_BACKEND),
            backend_options={str(k): str(v) for k, v in (spec.get("backendOptions") or {}).items()},
            headroom_bytes=parse_quantity(spec.get("headroom", 0), "spec.headroom"),
            jobs=jobs,
            node_selector=node_labels(spec.get("nodeSelector")),
            require_agent_registration=spec.get("requireAgentRegistration", False),
            phases=_phases(spec.get("phases") or {}),
            stage_aging_seconds=_integer(spec, "stageAgingSeconds", 300),
            early_yield=spec.get("earlyYield", True),
        )
    except ValidationError as error:
        raise InvalidArgumentError(_first_error(error, "spec.")) from None
    except InvalidArgumentError:
        raise
    except (TypeError, ValueError) as error:
        raise InvalidArgumentError(f"spec: {error}") from None


def _phases(phases: Mapping[str, Any]) -> dict[str, Any]:
    """`spec.phases` (name -> {kind, expectedSeconds}) as model input; the model names a
    bad kind (`spec.phases.rollout.kind: must be one of rollout, train, sync`)."""
    if not isinstance(phases, Mapping):
        raise InvalidArgumentError("spec.phases: must map phase names to {kind, expectedSeconds}")
    out: dict[str, Any] = {}
    for name, phase in phases.items():
        if not isinstance(phase, Mapping):
            raise InvalidArgumentError(f"spec.phases.{name}: must be a mapping with a kind")
        seconds = phase.get("expectedSeconds", 0)
        if isinstance(seconds, bool) or not isinstance(seconds, int):
            raise InvalidArgumentError(
                f"spec.phases.{name}.expectedSeconds: {seconds!r} is not a whole number of seconds"
            )
        out[str(name)] = {"kind": phase.get("kind"), "expected_seconds": float(seconds)}
    return out


def _job(index: int, job: Mapping[str, Any]) -> JobSpec:
    where = f"spec.jobs[{index}]."
    try:
        return JobSpec(
            name=job.get("name", ""),
            priority=int(job.get("priority", 0)),
            weight=float(_whole(job.get("weight", 1), f"{where}weight")),
            backend=str(job.get("backend", "")),
            parts=_parts(where, job.get("parts") or ()),
        )
    except ValidationError as error:
        raise InvalidArgumentError(_first_error(error, where)) from None
    except InvalidArgumentError:
        raise
    except (TypeError, ValueError, AttributeError) as error:
        raise InvalidArgumentError(f"{where.rstrip('.')}: {error}") from None


def _parts(where: str, parts: object) -> tuple[StatePart, ...]:
    """`spec.jobs[i].parts` as the model's parts; the first bad one is named in the
    resource's terms (`spec.jobs[1].parts[0].moveClass: must be one of ...`)."""
    if not isinstance(parts, (list, tuple)):
        raise InvalidArgumentError(f"{where}parts: must be a list of {{tag, bytes, moveClass}}")
    out: list[StatePart] = []
    seen: set[str] = set()
    for index, part in enumerate(parts):
        at = f"{where}parts[{index}]"
        if not isinstance(part, Mapping):
            raise InvalidArgumentError(f"{at}: must be a mapping with a tag and bytes")
        if "bytes" not in part:
            raise InvalidArgumentError(f"{at}.bytes: is required (a quantity like 8Gi, or bytes)")
        size = parse_quantity(part["bytes"], f"{at}.bytes")
        if size > MAX_PART_BYTES:
            raise InvalidArgumentError(f"{at}.bytes: {part['bytes']!r} is more than 2^63-1 bytes")
        move_class = part.get("moveClass", "offload")
        if not isinstance(move_class, str) or move_class not in MOVE_CLASSES:
            raise InvalidArgumentError(f"{at}.moveClass: must be one of {', '.join(MOVE_CLASSES)}")
        order = _whole(part.get("needOrder", 0), f"{at}.needOrder")
        if not 0 <= order <= MAX_NEED_ORDER:
            raise InvalidArgumentError(
                f"{at}.needOrder: {order} is not within 0 to {MAX_NEED_ORDER}"
            )
        try:
            state = StatePart(
                tag=part.get("tag", ""),
                bytes=size,
                move_class=MOVE_CLASSES[move_class],
                need_order=order,
            )
        except ValidationError as error:
            raise InvalidArgumentError(_first_error(error, f"{at}.")) from None
        if state.tag in seen:
            raise InvalidArgumentError(f"{at}.tag: {state.tag!r} is listed twice")
        seen.add(state.tag)
        out.append(state)
    return tuple(out)


def _whole(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{field}: {value!r} is not a whole number")
    return value


def _unique_jobs(jobs: tuple[JobSpec, ...]) -> None:
    seen: set[str] = set()
    for index, job in enumerate(jobs):
        if job.name in seen:
            raise InvalidArgumentError(f"spec.jobs[{index}].name: {job.name!r} is listed twice")
        seen.add(job.name)


_FIELD_NAMES = {
    "lease_seconds": "leaseSeconds",
    "max_hold_seconds": "maxHoldSeconds",
    "yield_grace_seconds": "yieldGraceSeconds",
    "backend_options": "backendOptions",
    "headroom_bytes": "headroom",
    "node_selector": "nodeSelector",
    "require_agent_registration": "requireAgentRegistration",
    "expected_seconds": "expectedSeconds",
    "stage_aging_seconds": "stageAgingSeconds",
    "early_yield": "earlyYield",
    "move_class": "moveClass",
    "need_order": "needOrder",
}


def _first_error(error: ValidationError, prefix: str) -> str:
    """`<prefix><camelCase field>: <message>` for the first pydantic error."""
    loc, message = first_error(error)
    where = [_FIELD_NAMES.get(part, part) for part in loc]
    field = prefix + ".".join(where) if where else prefix.rstrip(".")
    if prefix == "spec." and where and where[0] == "name":
        field = "metadata.name"
    return f"{field}: {message}"
