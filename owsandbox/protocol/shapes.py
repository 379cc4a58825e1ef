"""`parse(Shape, raw)`: a decoded JSON message checked against its `TypedDict`, or one error naming the field.

Both ends read the other's messages through this: the box every request's params, the host every
answer. It knows the few types the protocol's shapes use: `str`, `int`, `float`, `bool`, `Any`,
`None`, `Literal[...]`, `list[X]`, `dict[K, V]`, `X | Y`, `NotRequired[X]` and nested shapes.

It reads each shape's annotations as written, not through `typing.get_type_hints`, because the box
runs on whatever python3 the image has: with postponed annotations (`from __future__ import
annotations`) `list[X]` and `X | None` cannot be evaluated before 3.9 and 3.10, and before 3.12 a
class's `__required_keys__` counts a `NotRequired` field written as a string as required. So the
annotation's text is parsed (with `ast`) and its names looked up in the shape's module; a shape
built from real types (not strings) is read through `__required_keys__`/`__optional_keys__`.

Keys a shape does not name are let through (a newer peer may send more); an optional field sent as
`null` counts as absent (as the box has always read its params); a `bool` is never taken for an `int`
or a `float`, though JSON and Python both let it.
"""

from __future__ import annotations

import _ast  # the node classes and the parser's flag: `ast`'s own helpers are a quarter MiB more in a daemon
import builtins
import sys
import typing
from typing import Any, TypeVar, cast

Shape = TypeVar("Shape")

#: A compiled type: ("any",), ("type", python_type), ("literal", values), ("list", item),
#: ("dict", key, value), ("shape", typed_dict), ("union", alternatives).
Spec = tuple  # a bare alias: `tuple[...]` cannot be evaluated before Python 3.9, where the box may run

_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
          dict: "an object", type(None): "null"}


class ShapeError(ValueError):
    """A message that is not its shape: `field` names where (dotted, with `[i]` for a list's item)
    and `problem` what was wrong. `message("param")` says it as the box's errors say it."""

    def __init__(self, field: str, problem: str, missing: bool = False) -> None:
        self.field = field
        self.problem = problem
        self.missing = missing
        super().__init__(self.message())

    def message(self, noun: str = "field") -> str:
        if self.missing:
            return f"missing {noun} '{self.field}'"
        return f"{noun} '{self.field}' {self.problem}"


def parse(shape: type[Shape], raw: Any) -> Shape:
    """`raw` itself, once it is checked to be a `shape`; ShapeError names the first field that is
    missing or of the wrong type."""
    _check(("shape", shape), raw, "")
    return cast(Shape, raw)


def fields(shape: type) -> dict[str, tuple[Spec, bool]]:
    """Each field of `shape`: its compiled type and whether it is required (cached per shape)."""
    found = _CACHE.get(shape)
    if found is None:
        found = _CACHE[shape] = _compile_shape(shape)
    return found


_CACHE: dict[type, dict[str, tuple[Spec, bool]]] = {}


def _compile_shape(shape: type) -> dict[str, tuple[Spec, bool]]:
    module = vars(sys.modules[shape.__module__]) if shape.__module__ in sys.modules else {}
    total = getattr(shape, "__total__", True)
    optional = getattr(shape, "__optional_keys__", frozenset())
    compiled: dict[str, tuple[Spec, bool]] = {}
    for name, annotation in getattr(shape, "__annotations__", {}).items():
        text = annotation.__forward_arg__ if isinstance(annotation, typing.ForwardRef) else annotation
        if isinstance(text, str):
            spec, required = _from_text(text, module)
            compiled[name] = (spec, required and total)
        else:
            compiled[name] = (_from_object(annotation), name not in optional)
    return compiled


def _from_text(text: str, module: dict[str, Any]) -> tuple[Spec, bool]:
    """A field's annotation as written, compiled; and whether it is required (no `NotRequired`)."""
    node = compile(text, "<unknown>", "eval", _ast.PyCF_ONLY_AST).body  # as ast.parse(text, mode="eval")
    required = True
    if isinstance(node, _ast.Subscript) and _name(node.value) in ("NotRequired", "Required"):
        required = _name(node.value) == "Required"
        node = _slice(node)
    return _from_node(node, module), required


def _from_node(node: _ast.AST, module: dict[str, Any]) -> Spec:
    if isinstance(node, _ast.Constant) and node.value is None:
        return ("type", type(None))
    if isinstance(node, _ast.BinOp) and isinstance(node.op, _ast.BitOr):
        return _union([_from_node(node.left, module), _from_node(node.right, module)])
    if isinstance(node, _ast.Subscript):
        base = _name(node.value)
        inner = _slice(node)
        args = list(inner.elts) if isinstance(inner, _ast.Tuple) else [inner]
        if base == "Literal":
            return ("literal", tuple(cast(_ast.Constant, arg).value for arg in args))
        if base in ("list", "List", "Sequence"):
            return ("list", _from_node(args[0], module))
        if base in ("dict", "Dict", "Mapping"):
            return ("dict", _from_node(args[0], module), _from_node(args[1], module))
        if base == "Optional":
            return _union([_from_node(args[0], module), ("type", type(None))])
        if base == "Union":
            return _union([_from_node(arg, module) for arg in args])
        import ast

        raise TypeError(f"shapes: cannot check the type {ast.dump(node)}")
    name = _name(node)
    if name == "Any":
        return ("any",)
    value = module.get(name, getattr(builtins, name, None)) if name else None
    if value is None:
        raise TypeError(f"shapes: unknown name {name!r} in an annotation")
    return _from_object(value)


def _from_object(value: Any) -> Spec:
    """A real type (a builtin, a shape, a `Literal[...]` alias such as `Stream`), compiled."""
    if value is Any:
        return ("any",)
    if value is None or value is type(None):
        return ("type", type(None))
    if isinstance(value, type) and issubclass(value, dict) and hasattr(value, "__total__"):
        return ("shape", value)
    if value in (str, int, float, bool):
        return ("type", value)
    if value in (list, dict):
        return ("type", value)
    origin, args = typing.get_origin(value), typing.get_args(value)
    if origin is typing.Literal:
        return ("literal", args)
    if origin is list:
        return ("list", _from_object(args[0]) if args else ("any",))
    if origin is dict:
        return ("dict", *(_from_object(arg) for arg in args)) if args else ("type", dict)
    if origin is typing.Union or type(value).__name__ == "UnionType":
        return _union([_from_object(arg) for arg in args])
    raise TypeError(f"shapes: cannot check the type {value!r}")


def _union(specs: list[Spec]) -> Spec:
    flat: list[Spec] = []
    for spec in specs:
        flat.extend(spec[1] if spec[0] == "union" else [spec])
    return ("union", tuple(flat))


def _name(node: _ast.AST) -> str | None:
    if isinstance(node, _ast.Name):
        return node.id
    if isinstance(node, _ast.Attribute):  # typing.Any, t.Literal
        return node.attr
    return None


def _slice(node: _ast.Subscript) -> _ast.AST:
    inner = node.slice
    return cast(Any, inner).value if type(inner).__name__ == "Index" else inner  # Python 3.8 wraps it


def _where(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _check(spec: Spec, value: Any, path: str) -> None:
    kind = spec[0]
    if kind == "any":
        return
    if kind == "shape":
        if not isinstance(value, dict):
            raise ShapeError(path or "(message)", f"must be an object, not {_what(value)}")
        for key, (field, required) in fields(spec[1]).items():
            if key not in value or (value[key] is None and not required and not _allows_null(field)):
                if required:
                    raise ShapeError(_where(path, key), "is missing", missing=True)
                continue
            _check(field, value[key], _where(path, key))
        return
    if kind == "union":
        for alternative in spec[1]:
            try:
                _check(alternative, value, path)
                return
            except ShapeError:
                continue
        raise ShapeError(path, f"must be {_describe(spec)}, not {_what(value)}")
    if kind == "literal":
        if not any(value == allowed and type(value) is type(allowed) for allowed in spec[1]):
            raise ShapeError(path, f"must be {_describe(spec)}, not {value!r}")
        return
    if kind == "type":
        if not _is(value, spec[1]):
            raise ShapeError(path, f"must be {_describe(spec)}, not {_what(value)}")
        return
    if kind == "list":
        if not isinstance(value, list):
            raise ShapeError(path, f"must be a list, not {_what(value)}")
        for index, item in enumerate(value):
            _check(spec[1], item, f"{path}[{index}]")
        return
    if kind == "dict":
        if not isinstance(value, dict):
            raise ShapeError(path, f"must be an object, not {_what(value)}")
        for key, item in value.items():
            _check(spec[1], key, f"{path} key")
            _check(spec[2], item, f"{path}[{key!r}]")
        return
    raise AssertionError(spec)  # pragma: no cover - every compiled kind is above


def _allows_null(spec: Spec) -> bool:
    return spec == ("type", type(None)) or (spec[0] == "union" and ("type", type(None)) in spec[1])


def _is(value: Any, wanted: type) -> bool:
    if isinstance(value, bool):
        return wanted is bool
    if wanted is float:
        return isinstance(value, (int, float))
    return isinstance(value, wanted)


def _describe(spec: Spec) -> str:
    kind = spec[0]
    if kind == "type":
        return _NAMES.get(spec[1], spec[1].__name__)
    if kind == "literal":
        quoted = [repr(value) for value in spec[1]]
        return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]
    if kind == "union":
        return " or ".join(_describe(alternative) for alternative in spec[1])
    if kind == "list":
        return "a list"
    if kind == "shape" or kind == "dict":
        return "an object"
    return "anything"


def _what(value: Any) -> str:
    """How an error names what came instead (as the box's param errors always have)."""
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    return type(value).__name__

