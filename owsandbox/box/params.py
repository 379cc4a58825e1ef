"""Request params as their shapes, so that every bad call is answered with INVALID_PARAMS naming the param.

The box parses each request's params with `parsed(shape, raw)` (`protocol.shapes`) before its handler
runs. A file or process method's handler is a `Handler` (`@handles(METHOD)` over a function that
takes the params already parsed as `messages.REQUEST_SHAPES` names them): the dispatcher parses and
calls `typed`; called itself with a raw dict (as the search's child process, the shell's completion
and the tests call it) it parses them first, with the same errors. What a type cannot say (a minimum,
a finite number, a path without NUL) each handler checks with `at_least`, `finite` or its own words.

`get` and `string_list` read one param by name from a raw dict: what `shell.complete` and
`shell.inspect` read beyond their shape (`messages.ShellNameParams`), in the shell's completion.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from typing import Any

from ..protocol import INVALID_PARAMS, RunnerError
from ..protocol.messages import REQUEST_SHAPES
from ..protocol.shapes import Shape, ShapeError, parse

_TOP = re.compile(r"[.\[ ]")  # where a nested field's path leaves its param: `argv[1]`, `env key`
_MISSING = object()


def parsed(shape: type[Shape], raw: Any) -> Shape:
    """`raw` as `shape`; INVALID_PARAMS naming the param that is missing or of the wrong type."""
    try:
        return parse(shape, raw)
    except ShapeError as exc:
        raise RunnerError(INVALID_PARAMS, said(exc)) from None


def said(exc: ShapeError) -> str:
    """A param's error as the box says it: "missing param 'path'", "param 'max_entries' must be an
    integer, not str"; a wrong item inside a param names the param first, then the item:
    "param 'argv': 'argv[1]' must be a string, not int"."""
    top = _TOP.split(exc.field, 1)[0]
    if top == exc.field:
        return exc.message("param")
    inner = f"missing '{exc.field}'" if exc.missing else f"'{exc.field}' {exc.problem}"
    return f"param '{top}': {inner}"


def at_least(name: str, value: Any, minimum: float) -> Any:
    """`value` (a number, or None for absent), unless it is below `minimum`."""
    if value is not None and value < minimum:
        raise RunnerError(INVALID_PARAMS, f"param '{name}' must be at least {minimum}, not {value}")
    return value


def finite(name: str, value: Any) -> Any:
    """`value` (a number, or None for absent), unless it is infinite or not a number (JSON's parser
    in Python takes `Infinity` and `NaN`)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise RunnerError(INVALID_PARAMS, f"param '{name}' must be a finite number, not {value}")
    return value


class Handler:
    """The handler of one file or process method: `typed(params, base)` answers with the params already
    parsed as the method's shape (`shape`), relative paths starting at the folder `base`; calling the
    handler itself with a raw dict parses them first."""

    def __init__(self, method: str, typed: Callable[[Any, str], Any]) -> None:
        self.method = method
        self.shape: type = REQUEST_SHAPES[method]
        self.typed = typed
        functools.update_wrapper(self, typed)

    def __call__(self, raw: Any, base: str) -> Any:
        return self.typed(parsed(self.shape, raw), base)

    def __repr__(self) -> str:
        return f"<handler of {self.method}: {self.typed.__qualname__}>"


def handles(method: str) -> Callable[[Callable[[Any, str], Any]], Handler]:
    """Make a function of (params as `method`'s shape, base folder) the handler of `method`."""
    return lambda typed: Handler(method, typed)


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


def string_list(params: dict[str, Any], name: str, default: Any = _MISSING) -> Any:
    value = get(params, name, list, default)
    if value is not None and not all(isinstance(item, str) for item in value):
        raise RunnerError(INVALID_PARAMS, f"param '{name}' must be a list of strings")
    return value
