"""Checking request params, so that every bad call is answered with INVALID_PARAMS naming the param."""

from __future__ import annotations

import math
from typing import Any

from ..protocol import INVALID_PARAMS, RunnerError

_MISSING = object()


def _kind(types: type | tuple[type, ...]) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
             list: "a list", dict: "an object"}
    if isinstance(types, tuple):
        return " or ".join(names.get(t, t.__name__) for t in types)
    return names.get(types, types.__name__)


def get(params: dict[str, Any], name: str, types: type | tuple[type, ...], default: Any = _MISSING) -> Any:
    """The value of `name`, checked against `types`; without a default the param is required."""
    value = params.get(name, _MISSING)
    if value is _MISSING or (value is None and default is not _MISSING):
        if default is _MISSING:
            raise RunnerError(INVALID_PARAMS, f"missing param '{name}'")
        return default
    wanted = types if isinstance(types, tuple) else (types,)
    # bool is an int in Python; a boolean where a number is wanted is still a mistake.
    if isinstance(value, bool) and bool not in wanted:
        raise RunnerError(INVALID_PARAMS, f"param '{name}' must be {_kind(types)}, not a boolean")
    if not isinstance(value, wanted):
        raise RunnerError(INVALID_PARAMS, f"param '{name}' must be {_kind(types)}, not {type(value).__name__}")
    return value


def number(params: dict[str, Any], name: str, default: Any = _MISSING, minimum: float | None = None) -> Any:
    value = get(params, name, (int, float), default)
    if isinstance(value, float) and not math.isfinite(value):
        raise RunnerError(INVALID_PARAMS, f"param '{name}' must be a finite number, not {value}")
    if value is not None and minimum is not None and value < minimum:
        raise RunnerError(INVALID_PARAMS, f"param '{name}' must be at least {minimum}, not {value}")
    return value


def string_list(params: dict[str, Any], name: str, default: Any = _MISSING) -> Any:
    value = get(params, name, list, default)
    if value is not None and not all(isinstance(item, str) for item in value):
        raise RunnerError(INVALID_PARAMS, f"param '{name}' must be a list of strings")
    return value
