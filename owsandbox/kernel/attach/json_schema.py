"""A small JSON Schema checker (a subset: type, required, properties, additionalProperties, enum, items).

Why our own: an MCP server's `tools/list` gives each tool an `inputSchema`, and a `tools/call` whose
arguments miss a required field or have the wrong type is better refused in the notebook, naming
the field, than sent for a server to answer with an error of its own words (or to crash on). The
box has no network and the kernel keeps its dependencies few, so this is stdlib Python: pure
functions of a schema and a value. Keywords outside the subset (minimum, pattern, format, $ref,
oneOf, ...) are not checked; a value passes them. A schema that is not an object (or `true`)
accepts everything, as JSON Schema says.
"""

from __future__ import annotations

import json
from typing import Any

_TYPES = ("string", "number", "integer", "boolean", "object", "array", "null")


def type_of(value: Any) -> str:
    """The JSON type of a value decoded by json.loads (an integral number is an "integer")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _is(value: Any, wanted: str) -> bool:
    actual = type_of(value)
    return actual == wanted or (wanted == "number" and actual == "integer")


def _where(path: str, key: str | int) -> str:
    return f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}"


def problems(schema: Any, value: Any, path: str = "arguments") -> list[str]:
    """What is wrong with `value` under `schema`, one sentence each naming the field (by its path
    from `path`); [] when it passes."""
    if not isinstance(schema, dict):
        return [] if schema is not False else [f"{path} is not allowed (its schema is false)"]
    found: list[str] = []
    wanted = schema.get("type")
    names = [wanted] if isinstance(wanted, str) else [t for t in wanted if isinstance(t, str)] \
        if isinstance(wanted, list) else []
    names = [n for n in names if n in _TYPES]
    if names and not any(_is(value, name) for name in names):
        return [f"{path} should be {' or '.join(names)}, not {type_of(value)} ({_short(value)})"]
    if "enum" in schema and isinstance(schema["enum"], list) and not any(_same(value, e) for e in schema["enum"]):
        found.append(f"{path} should be one of {', '.join(_short(e) for e in schema['enum'])}, not {_short(value)}")
    if "const" in schema and not _same(value, schema["const"]):
        found.append(f"{path} should be {_short(schema['const'])}, not {_short(value)}")
    if isinstance(value, dict):
        found += _object(schema, value, path)
    if isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, (dict, bool)):
            for index, item in enumerate(value):
                found += problems(items, item, _where(path, index))
    return found


def _object(schema: dict[str, Any], value: dict[str, Any], path: str) -> list[str]:
    found = []
    properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = schema.get("required") if isinstance(schema.get("required"), list) else []
    for name in required:
        if isinstance(name, str) and name not in value:
            found.append(f"{_where(path, name)} is required but missing")
    extra = schema.get("additionalProperties", True)
    for name, item in value.items():
        if name in properties:
            found += problems(properties[name], item, _where(path, name))
        elif extra is False:
            known = ", ".join(sorted(properties)) or "none"
            found.append(f"{_where(path, name)} is not a known property (additionalProperties is false; "
                         f"known: {known})")
        elif isinstance(extra, dict):
            found += problems(extra, item, _where(path, name))
    return found


def _same(a: Any, b: Any) -> bool:
    """JSON equality: 1 and 1.0 are the same number, true is not 1."""
    if type_of(a) in ("integer", "number") and type_of(b) in ("integer", "number"):
        return bool(a == b)
    return type_of(a) == type_of(b) and a == b


def _short(value: Any, chars: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= chars else text[:chars] + "…"
