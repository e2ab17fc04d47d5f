"""Argument checks shared by the planner's functions.

Every public function validates its inputs with these and raises
`rlslice.InvalidArgumentError` (a `ValueError`) whose one-line message names the argument.
Booleans are refused where a number is expected (`True` is an `int` in Python, but a
parameter count of `True` is always a mistake), and non-finite numbers are refused.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from rlslice._errors import InvalidArgumentError


def integer(name: str, value: object, *, minimum: int | None = None) -> int:
    """`value` as an int, or an error naming `name` (bools and floats are refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise InvalidArgumentError(f"{name} must be at least {minimum}, got {value!r}")
    return value


def real(
    name: str,
    value: object,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    positive: bool = False,
) -> float:
    """`value` as a finite float, or an error naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgumentError(f"{name} must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise InvalidArgumentError(f"{name} must be finite, got {value!r}")
    if positive and number <= 0:
        raise InvalidArgumentError(f"{name} must be positive, got {value!r}")
    if minimum is not None and number < minimum:
        raise InvalidArgumentError(f"{name} must be at least {minimum}, got {value!r}")
    if maximum is not None and number > maximum:
        raise InvalidArgumentError(f"{name} must be at most {maximum}, got {value!r}")
    return number


def reals(
    name: str, values: object, *, minimum: float | None = None, nonempty: bool = True
) -> tuple[float, ...]:
    """A sequence of finite numbers; the message names the offending element."""
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise InvalidArgumentError(f"{name} must be a sequence of numbers, got {values!r}")
    items = tuple(values)
    if nonempty and not items:
        raise InvalidArgumentError(f"{name} must not be empty")
    return tuple(real(f"{name}[{i}]", v, minimum=minimum) for i, v in enumerate(items))


def choice(name: str, value: object, options: Iterable[str]) -> str:
    """One of `options`, or an error listing them."""
    allowed = tuple(options)
    if not isinstance(value, str) or value not in allowed:
        raise InvalidArgumentError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
    return value


def name(field: str, value: object) -> str:
    """A non-empty string (a job, phase or group name)."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgumentError(f"{field} must be a non-empty string, got {value!r}")
    return value
