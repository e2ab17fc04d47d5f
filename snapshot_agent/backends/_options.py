"""Backend options as validated models: each backend declares its options as a pydantic
model, and `parse` turns the strings of a group spec or the agent's flags into it, or
refuses them with one line that names the field (`OptionsError`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from rlslice.snapshot_agent.backends.base import BackendError, OptionsError

M = TypeVar("M", bound=BaseModel)


def parse(
    model: type[M],
    options: Mapping[str, str],
    *,
    error: type[BackendError] = OptionsError,
    what: str = "",
) -> M:
    """`options` as `model`: an empty value counts as unset, keys the model does not name
    are ignored (they are other backends' or the agent's). `error` (OptionsError unless
    the backend says otherwise) names the first field that does not validate, after
    `what` ("cuda: option ", say)."""
    given = {key: value for key, value in options.items() if value != ""}
    try:
        return model.model_validate(given)
    except ValidationError as invalid:
        first = invalid.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or model.__name__
        got = given.get(field, first.get("input"))
        raise error(f"{what}{field}: {first['msg'].lower()}, got {got!r}") from None
