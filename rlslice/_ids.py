"""Validation of ids (job, group, node) and other request fields. Pure."""

from __future__ import annotations

import math
import re

from rlslice._errors import InvalidArgumentError

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MAX_ID_LENGTH = 63


def validate_id(value: object, field: str) -> str:
    """Return `value` if it is a DNS-1123 label, else raise naming `field`.

    >>> validate_id("grpo-7b", "job")
    'grpo-7b'
    """
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{field}: must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidArgumentError(f"{field}: must not be empty")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidArgumentError(
            f"{field}: {len(value)} characters, at most {MAX_ID_LENGTH} allowed"
        )
    if not _DNS1123_LABEL.fullmatch(value):
        shown = value if value.isprintable() else repr(value)
        raise InvalidArgumentError(
            f"{field}: {shown!r} is not a DNS-1123 label "
            "(lower-case letters, digits and '-', starting and ending with a letter or digit)"
        )
    return value


def is_valid_id(value: object) -> bool:
    """True when `value` is a DNS-1123 label."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= MAX_ID_LENGTH
        and bool(_DNS1123_LABEL.fullmatch(value))
    )


def validate_seconds(
    value: float,
    field: str,
    *,
    minimum: float = 0.0,
    maximum: float = 86_400.0,
    allow_zero: bool = True,
) -> float:
    """Return `value` if it is a finite number of seconds within bounds, else raise naming `field`."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgumentError(f"{field}: must be a number of seconds")
    if not math.isfinite(value):
        raise InvalidArgumentError(f"{field}: must be finite, got {value}")
    if value == 0 and allow_zero:
        return float(value)
    if value < minimum or value > maximum:
        raise InvalidArgumentError(f"{field}: {value} is outside [{minimum}, {maximum}]")
    return float(value)
