"""`protocol.shapes.parse`: a message checked against its TypedDict, one error naming the field."""

from __future__ import annotations

from typing import Any, Literal, TypedDict

import pytest

from owsandbox.protocol import messages as M
from owsandbox.protocol import methods
from owsandbox.protocol.shapes import ShapeError, fields, parse

pytestmark = pytest.mark.unit


class Inner(TypedDict):
    n: int


class Outer(TypedDict, total=False):
    """A shape of every kind of field, some written as real types (not strings)."""

    names: list[str]
    table: dict[str, Inner]
    maybe: float | None
    kind: Literal["a", "b"]
    anything: Any


def fails(shape: type, raw: Any) -> ShapeError:
    with pytest.raises(ShapeError) as err:
        parse(shape, raw)
    return err.value


def test_a_good_message_comes_back_as_it_is() -> None:
    raw = {"command": "ls", "shell": "main", "timeout_s": 3, "stderr": "merge", "extra": "kept"}
    assert parse(M.RunParams, raw) is raw


def test_a_missing_field_is_named_as_the_box_has_always_named_it() -> None:
    err = fails(M.RunParams, {"shell": "main"})
    assert (err.field, err.missing) == ("command", True)
    assert err.message("param") == "missing param 'command'" and str(err) == "missing field 'command'"


@pytest.mark.parametrize(("raw", "message"), [
    ({"command": 1}, "param 'command' must be a string, not int"),
    ({"command": "x", "timeout_s": True}, "param 'timeout_s' must be a number, not a boolean"),
    ({"command": "x", "cols": 1.5}, "param 'cols' must be an integer, not float"),
    ({"command": "x", "terminal": 1}, "param 'terminal' must be a boolean, not int"),
    ({"command": "x", "stderr": "both"}, "param 'stderr' must be 'apart' or 'merge', not 'both'"),
    ({"command": None}, "param 'command' must be a string, not null"),
])
def test_a_wrong_type_is_named_with_what_came_instead(raw: dict[str, Any], message: str) -> None:
    assert fails(M.RunParams, raw).message("param") == message


def test_an_optional_field_sent_as_null_is_absent() -> None:
    parse(M.RunParams, {"command": "x", "cwd": None, "timeout_s": None})


def test_a_field_that_may_be_null_takes_null_and_its_type_only() -> None:
    stat = {"path": "p", "exists": False, "type": None, "size": None, "mode": None, "mtime": None, "sha256": None}
    parse(M.StatResult, stat)
    assert str(fails(M.StatResult, {**stat, "size": "big"})) == "field 'size' must be an integer or null, not str"


def test_nested_shapes_and_lists_name_the_path_to_the_field() -> None:
    shell = {"name": "main", "cwd": "/w", "busy": False}
    parse(M.ListShellsResult, {"shells": [shell]})
    assert str(fails(M.ListShellsResult, {"shells": [shell, {**shell, "busy": "no"}]})) == (
        "field 'shells[1].busy' must be a boolean, not str")
    assert str(fails(M.ListShellsResult, {"shells": shell})) == "field 'shells' must be a list, not dict"
    assert fails(M.ListShellsResult, {"shells": [{"name": "x"}]}).field == "shells[0].cwd"


def test_real_types_dicts_unions_and_any() -> None:
    parse(Outer, {})  # total=False: nothing is required
    parse(Outer, {"names": ["a"], "table": {"k": {"n": 1}}, "maybe": None, "kind": "b", "anything": object()})
    assert fails(Outer, {"table": {"k": {"n": "1"}}}).field == "table['k'].n"
    assert fails(Outer, {"names": ["a", 2]}).field == "names[1]"
    assert str(fails(Outer, {"kind": "c"})) == "field 'kind' must be 'a' or 'b', not 'c'"
    assert str(fails(Outer, {"maybe": "1"})) == "field 'maybe' must be a number or null, not str"


def test_a_message_that_is_not_an_object_says_so() -> None:
    assert str(fails(M.RunParams, [1])) == "field '(message)' must be an object, not list"


def test_not_required_written_as_a_string_is_optional_whatever_python_says() -> None:
    """Before Python 3.12 a class's `__required_keys__` counts `NotRequired[...]` in a postponed
    annotation as required; the shapes read the annotation itself."""
    assert {name for name, (_, required) in fields(M.RunParams).items() if required} == {"command"}
    assert fields(M.OutputFrame)["seq"][1] is False and fields(M.OutputFrame)["offset"][1] is True


def test_every_live_frame_the_box_sends_has_a_shape_and_every_shape_compiles() -> None:
    assert set(M.LIVE_SHAPES) == {methods.SHELL_OUTPUT, methods.SHELL_PROGRESS, methods.SHELL_INPUT_WANTED}
    for table in (M.REQUEST_SHAPES, M.RESULT_SHAPES, M.LIVE_SHAPES):
        for method, shape in table.items():
            assert method in methods.REQUESTS | methods.NOTIFICATIONS
            assert fields(shape), shape


def test_progress_is_a_frame_of_its_own_as_the_box_sends_it() -> None:
    frame = {"id": "r1", "shell": "main", "elapsed_s": 5.002, "output_bytes": 0}
    assert parse(M.ProgressFrame, frame) is frame
    assert fails(M.OutputFrame, frame).field == "stream"  # not an output frame with a flag
