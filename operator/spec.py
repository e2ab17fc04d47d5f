"""Convert a TimeSliceGroup resource into the scheduler's `GroupSpec`. Pure.

The CRD's schema already bounds every field; this conversion re-validates through the
shared pydantic model, so a spec that slipped past the API server (an older CRD, a client
without field validation) fails here with a message naming the field, before any call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from rlslice._errors import InvalidArgumentError
from rlslice.config import GroupSpec, JobSpec

#: API group, version and plural of the resource.
GROUP = "rlslice.dev"
VERSION = "v1alpha1"
PLURAL = "timeslicegroups"

#: The CRD's defaults, applied when the API server did not (a missing or older CRD).
DEFAULT_BACKEND = "cuda"


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
            lease_seconds=float(spec.get("leaseSeconds", 30.0)),
            max_hold_seconds=float(spec.get("maxHoldSeconds", 0.0)),
            yield_grace_seconds=float(spec.get("yieldGraceSeconds", 10.0)),
            backend=spec.get("backend", DEFAULT_BACKEND),
            backend_options={str(k): str(v) for k, v in (spec.get("backendOptions") or {}).items()},
            headroom_bytes=int(spec.get("headroomBytes", 0)),
            jobs=jobs,
            node_selector={str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()},
            require_agent_registration=spec.get("requireAgentRegistration", False),
        )
    except ValidationError as error:
        raise InvalidArgumentError(_first_error(error, "spec.")) from None
    except (TypeError, ValueError) as error:
        raise InvalidArgumentError(f"spec: {error}") from None


def _job(index: int, job: Mapping[str, Any]) -> JobSpec:
    where = f"spec.jobs[{index}]."
    try:
        return JobSpec(
            name=job.get("name", ""),
            priority=int(job.get("priority", 0)),
            weight=float(job.get("weight", 1.0)),
            backend=str(job.get("backend", "")),
        )
    except ValidationError as error:
        raise InvalidArgumentError(_first_error(error, where)) from None
    except (TypeError, ValueError, AttributeError) as error:
        raise InvalidArgumentError(f"{where.rstrip('.')}: {error}") from None


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
    "headroom_bytes": "headroomBytes",
    "node_selector": "nodeSelector",
    "require_agent_registration": "requireAgentRegistration",
}


def _first_error(error: ValidationError, prefix: str) -> str:
    """`<prefix><camelCase field>: <message>` for the first pydantic error."""
    first = error.errors()[0]
    where = [_FIELD_NAMES.get(str(part), str(part)) for part in first["loc"]]
    field = prefix + ".".join(where) if where else prefix.rstrip(".")
    if prefix == "spec." and where and where[0] == "name":
        field = "metadata.name"
    message = str(first["msg"]).removeprefix("Value error, ")
    if first["loc"]:  # the shared validators already name their field: say it once
        message = message.removeprefix(f"{first['loc'][-1]}: ")
    return f"{field}: {message}"
