"""The file and process methods (`fs.*`, `proc.run`, `box.usage`) typed at both ends: each has a params
shape the box parses before its handler runs, and a result shape the client parses where answers
arrive, so a bad request is INVALID_PARAMS naming the param and a bad answer an error naming the
method, the shape and the field (not a KeyError somewhere later). Against the real dispatcher and the
real client over an in-memory pipe: a unit test opens no socket and starts no process."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

import pytest

from owsandbox import protocol as P
from owsandbox.box import procs, usage
from owsandbox.box.dispatch import HANDLED_IN, Dispatcher, handler_of
from owsandbox.box.files import ops as fsops
from owsandbox.box.files import search as searchchild
from owsandbox.box.outbox import Records
from owsandbox.box.params import parsed
from owsandbox.box.shell.registry import ShellRegistry
from owsandbox.host.client import RunnerClient, checked_answer
from owsandbox.protocol import messages as M
from owsandbox.protocol import methods
from owsandbox.protocol.shapes import ShapeError, fields, parse

from .test_host_client_folders import Box, Pipe

pytestmark = pytest.mark.unit

FILE_METHODS = {methods.FS_READ, methods.FS_WRITE, methods.FS_STAT, methods.FS_LIST, methods.FS_SEARCH,
                methods.FS_MKDIR, methods.FS_REMOVE, methods.PROC_RUN, methods.BOX_USAGE}
SHA = "ab" * 32
STAT = {"path": "/w/a", "exists": True, "type": "file", "size": 3, "mode": "0644", "mtime": 1.5, "sha256": SHA}
LINES = {"path": "/w/a", "text": "x\n", "start_line": 1, "end_line": 1, "total_lines": 1, "total_bytes": 2, "eof": True}
BYTES = {"path": "/w/a", "data_b64": "eA==", "offset_bytes": 0, "length": 1, "total_bytes": 2, "eof": False}
PROC = {"exit_code": 0, "stdout": "hi\n", "stderr": "", "timed_out": False, "stdout_truncated": False,
        "stderr_truncated": False, "duration_ms": 4}

#: Each shape: a well-formed message, and one field of the wrong type with what the error says of it.
PARAMS: list[tuple[type, dict[str, Any], str, Any, str]] = [
    (M.ReadParams, {"path": "a.txt", "offset_line": 3, "limit_lines": 10, "shell": "main"},
     "offset_line", "3", "param 'offset_line' must be an integer, not str"),
    (M.ReadParams, {"path": "a.txt", "offset_bytes": 0, "limit_bytes": 5},
     "limit_bytes", True, "param 'limit_bytes' must be an integer, not a boolean"),
    (M.WriteParams, {"path": "a", "text": "x", "if_match_sha256": "", "append": True, "make_parents": False},
     "append", "yes", "param 'append' must be a boolean, not str"),
    (M.WriteParams, {"path": "a", "data_b64": "eA=="},
     "data_b64", ["x"], "param 'data_b64' must be a string, not list"),
    (M.StatParams, {"path": "a"}, "path", 5, "param 'path' must be a string, not int"),
    (M.ListParams, {"path": ".", "max_entries": 5},
     "max_entries", 2.5, "param 'max_entries' must be an integer, not float"),
    (M.SearchParams, {"pattern": "x", "path": "src", "glob": "*.py", "ignore_case": True, "max_matches": 5,
                      "timeout_s": 1.5}, "timeout_s", "soon", "param 'timeout_s' must be a number, not str"),
    (M.MkdirParams, {"path": "d", "parents": False}, "parents", 1, "param 'parents' must be a boolean, not int"),
    (M.RemoveParams, {"path": "d", "recursive": True},
     "recursive", "no", "param 'recursive' must be a boolean, not str"),
    (M.ProcParams, {"argv": ["ls", "-l"], "cwd": "sub", "env": {"A": "1"}, "stdin": "", "timeout_s": 3},
     "argv", "ls -l", "param 'argv' must be a list, not str"),
    (M.ProcParams, {"argv": ["ls"]}, "env", {"A": 1}, "param 'env': 'env['A']' must be a string, not int"),
    (M.ProcParams, {"argv": ["ls"]}, "argv", ["ls", 3], "param 'argv': 'argv[1]' must be a string, not int"),
    (M.UsageParams, {}, "shell", 3, "param 'shell' must be a string, not int"),
]
RESULTS: list[tuple[type, dict[str, Any], str, Any, str]] = [
    (M.ReadLinesResult, LINES, "eof", "yes", "field 'eof' must be a boolean, not str"),
    (M.ReadBytesResult, BYTES, "length", None, "field 'length' must be an integer, not null"),
    (M.WriteResult, {"path": "/w/a", "bytes_written": 1, "sha256": SHA, "size": 1},
     "sha256", 1, "field 'sha256' must be a string, not int"),
    (M.StatResult, STAT, "exists", "yes", "field 'exists' must be a boolean, not str"),
    (M.StatResult, {**STAT, "exists": False, "type": None, "size": None, "mode": None, "mtime": None, "sha256": None},
     "mtime", "now", "field 'mtime' must be a number or null, not str"),
    (M.ListResult, {"path": "/w", "entries": [{"name": "a", "type": "file", "size": 3, "mtime": 1.5}],
                    "truncated": False},
     "entries", [{"name": "a", "type": "file", "size": "3", "mtime": 1.5}],
     "field 'entries[0].size' must be an integer, not str"),
    (M.SearchResult, {"matches": [{"path": "/w/a", "line": 2, "text": "hit"}], "truncated": False, "files_searched": 1},
     "matches", [{"path": "/w/a", "text": "hit"}], "missing field 'matches[0].line'"),
    (M.MkdirResult, {"path": "/w/d", "created": True}, "created", 1, "field 'created' must be a boolean, not int"),
    (M.RemoveResult, {"path": "/w/d", "removed": False}, "path", None, "field 'path' must be a string, not null"),
    (M.ProcResult, PROC, "exit_code", "0", "field 'exit_code' must be an integer, not str"),
    (M.Usage, {"memory_bytes": 1 << 20, "cpu_seconds": 0.5, "processes": 3, "cpus": 2},
     "cpus", 2.0, "field 'cpus' must be an integer, not float"),
]
SHAPES = PARAMS + RESULTS


def names(row: tuple[Any, ...]) -> str:
    return f"{row[0].__name__}-{row[2]}"


def test_the_tables_cover_every_shape_of_the_file_and_process_methods() -> None:
    wanted = {M.REQUEST_SHAPES[method] for method in FILE_METHODS}
    wanted |= {M.RESULT_SHAPES[method] for method in FILE_METHODS}
    wanted |= {shape for method, (_, shape) in M.RESULT_VARIANTS.items() if method in FILE_METHODS}
    assert {row[0] for row in SHAPES} == wanted
    assert set(M.REQUEST_SHAPES) >= FILE_METHODS and set(M.RESULT_SHAPES) >= FILE_METHODS


@pytest.mark.parametrize("row", SHAPES, ids=names)
def test_a_well_formed_message_is_its_shape_and_unknown_fields_pass(row: tuple[Any, ...]) -> None:
    """Keys a shape does not name are let through, as `shapes` does for every message (a newer peer may send more)."""
    shape, good = row[0], row[1]
    assert parse(shape, good) is good
    newer = {**good, "from_a_newer_peer": 1}
    assert parse(shape, newer) is newer


@pytest.mark.parametrize(("shape", "good", "field"), [
    (row[0], row[1], name) for row in SHAPES for name, (_, required) in fields(row[0]).items() if required])
def test_each_missing_required_field_is_named(shape: type, good: dict[str, Any], field: str) -> None:
    raw = {key: value for key, value in good.items() if key != field}
    with pytest.raises(ShapeError) as err:
        parse(shape, raw)
    assert (err.value.field, err.value.missing, str(err.value)) == (field, True, f"missing field '{field}'")
    if shape in M.REQUEST_SHAPES.values():
        with pytest.raises(P.RunnerError) as said:
            parsed(shape, raw)
        assert (said.value.code, said.value.message) == (P.INVALID_PARAMS, f"missing param '{field}'")


@pytest.mark.parametrize("row", PARAMS, ids=names)
def test_a_param_of_the_wrong_type_is_named_as_the_box_says_it(row: tuple[Any, ...]) -> None:
    shape, good, field, value, message = row
    with pytest.raises(P.RunnerError) as err:
        parsed(shape, {**good, field: value})
    assert (err.value.code, err.value.message) == (P.INVALID_PARAMS, message)


@pytest.mark.parametrize("row", RESULTS, ids=names)
def test_a_result_field_of_the_wrong_type_is_named(row: tuple[Any, ...]) -> None:
    shape, good, field, value, message = row
    with pytest.raises(ShapeError) as err:
        parse(shape, {**good, field: value})
    assert str(err.value) == message


# -- the box: each request parsed as its shape before its handler runs --------------------------


def test_each_handler_takes_its_methods_shape() -> None:
    handlers = {**fsops.HANDLERS, **procs.HANDLERS, **searchchild.HANDLERS, **usage.HANDLERS}
    assert set(handlers) == FILE_METHODS
    for method, handler in handlers.items():
        assert (handler.method, handler.shape) == (method, M.REQUEST_SHAPES[method])


def test_the_dispatcher_imports_each_methods_handler_from_the_module_that_has_it() -> None:
    """Its table of modules (imported at a method's first request) says what the modules' own tables say."""
    handlers = {**fsops.HANDLERS, **procs.HANDLERS, **searchchild.HANDLERS, **usage.HANDLERS}
    assert set(HANDLED_IN) == FILE_METHODS
    assert {method: handler_of(method) for method in HANDLED_IN} == handlers


class Answers:
    """Stands for the client's connection: the answers the dispatcher sends, from whichever thread."""

    def __init__(self) -> None:
        self.frames: dict[Any, dict[str, Any]] = {}
        self.changed = threading.Condition()

    def send(self, frame: bytes) -> bool:
        message = json.loads(frame)
        with self.changed:
            self.frames[message.get("id")] = message
            self.changed.notify_all()
        return True

    def answer(self, request_id: str) -> dict[str, Any]:
        with self.changed:
            assert self.changed.wait_for(lambda: request_id in self.frames, 30), f"no answer to {request_id}"
            return self.frames[request_id]


def ask(tmp_path: Path, method: str, params: dict[str, Any]) -> dict[str, Any]:
    sent = Answers()
    router = Dispatcher(Records(), ShellRegistry(str(tmp_path)), sent.send, lambda: {}, "instance")
    router.handle(sent, P.request("r1", method, params))
    return sent.answer("r1")


@pytest.mark.parametrize(("method", "params", "message"), [
    (methods.FS_READ, {"path": "f", "offset_line": "2"}, "param 'offset_line' must be an integer, not str"),
    (methods.FS_WRITE, {"text": "x"}, "missing param 'path'"),
    (methods.FS_WRITE, {"path": "new.txt", "text": "x", "make_parents": 1},
     "param 'make_parents' must be a boolean, not int"),
    (methods.FS_STAT, {"path": 5}, "param 'path' must be a string, not int"),
    (methods.FS_LIST, {"max_entries": "10"}, "param 'max_entries' must be an integer, not str"),
    (methods.FS_SEARCH, {"pattern": "x", "timeout_s": True}, "param 'timeout_s' must be a number, not a boolean"),
    (methods.FS_MKDIR, {"path": "d", "parents": "no"}, "param 'parents' must be a boolean, not str"),
    (methods.FS_REMOVE, {"path": "d", "recursive": 1}, "param 'recursive' must be a boolean, not int"),
    (methods.PROC_RUN, {"argv": ["true", 3]}, "param 'argv': 'argv[1]' must be a string, not int"),
    (methods.PROC_RUN, {"argv": ["true"], "env": ["A=1"]}, "param 'env' must be an object, not list"),
    (methods.BOX_USAGE, {"shell": ["main"]}, "param 'shell' must be a string, not list"),
])
def test_the_box_refuses_a_bad_request_before_its_handler_runs(tmp_path: Path, method: str,
                                                                params: dict[str, Any], message: str) -> None:
    """Nothing is touched: no file written, no process started (a unit test may start none)."""
    (tmp_path / "d").mkdir()
    answer = ask(tmp_path, method, params)
    assert answer["error"] == {"code": P.INVALID_PARAMS, "message": message}
    assert sorted(path.name for path in tmp_path.iterdir()) == ["d"]


@pytest.mark.parametrize(("method", "params"), [
    (methods.FS_WRITE, {"path": "sub/a.txt", "text": "x\n", "make_parents": True}),
    (methods.FS_READ, {"path": "a.txt"}),
    (methods.FS_READ, {"path": "a.txt", "offset_bytes": 1}),
    (methods.FS_STAT, {"path": "a.txt"}),
    (methods.FS_STAT, {"path": "missing"}),
    (methods.FS_LIST, {}),
    (methods.FS_MKDIR, {"path": "d"}),
    (methods.FS_REMOVE, {"path": "sub", "recursive": True}),
    (methods.BOX_USAGE, {}),
])
def test_the_box_answers_as_the_result_shape(tmp_path: Path, method: str, params: dict[str, Any]) -> None:
    """(`fs.search` and `proc.run` start processes: tests/test_runner_files.py and
    tests/security/test_daemon_never_blocks.py see theirs through the client, which parses them.)"""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.txt").write_text("x\n")
    (tmp_path / "a.txt").write_text("one\ntwo\n")
    result = ask(tmp_path, method, params)["result"]
    shape = M.result_shape(method, result)
    assert shape is not None and parse(shape, result) is result


# -- the host: every answer parsed as its shape where the client receives it ------------------

#: Each method: a well-formed answer, and a malformed one with the error the call fails with.
ANSWERS: list[tuple[str, dict[str, Any], dict[str, Any], str]] = [
    (methods.FS_READ, LINES, {**LINES, "total_lines": "1"},
     "ReadLinesResult: field 'total_lines' must be an integer, not str"),
    (methods.FS_READ, BYTES, {k: v for k, v in BYTES.items() if k != "eof"}, "ReadBytesResult: missing field 'eof'"),
    (methods.FS_WRITE, {"path": "/w/a", "bytes_written": 1, "sha256": SHA, "size": 1},
     {"path": "/w/a", "bytes_written": 1, "sha256": SHA}, "WriteResult: missing field 'size'"),
    (methods.FS_STAT, STAT, {**STAT, "size": "3"}, "StatResult: field 'size' must be an integer or null, not str"),
    (methods.FS_LIST, {"path": "/w", "entries": [], "truncated": False},
     {"path": "/w", "entries": {}, "truncated": False},
     "ListResult: field 'entries' must be a list, not dict"),
    (methods.FS_SEARCH, {"matches": [], "truncated": True, "files_searched": 0},
     {"matches": [{"path": "/w/a", "line": "2", "text": "x"}], "truncated": True, "files_searched": 1},
     "SearchResult: field 'matches[0].line' must be an integer, not str"),
    (methods.FS_MKDIR, {"path": "/w/d", "created": False}, {"path": "/w/d"}, "MkdirResult: missing field 'created'"),
    (methods.FS_REMOVE, {"path": "/w/d", "removed": True}, {"path": "/w/d", "removed": "yes"},
     "RemoveResult: field 'removed' must be a boolean, not str"),
    (methods.PROC_RUN, PROC, {**PROC, "stdout": None}, "ProcResult: field 'stdout' must be a string, not null"),
    (methods.BOX_USAGE, {"memory_bytes": 1, "cpu_seconds": 0.0, "processes": 1, "cpus": 1},
     {"memory_bytes": 1, "cpu_seconds": "0", "processes": 1, "cpus": 1},
     "Usage: field 'cpu_seconds' must be a number, not str"),
]


class LyingBox(Box):
    """A box that answers every file and process call with the answer it is given."""

    def __init__(self, answers: dict[str, Any]) -> None:
        super().__init__("one")
        self.answers = answers

    def answer(self, message: dict[str, Any]) -> dict[str, Any] | None:
        if message.get("method") in self.answers:
            return P.result(message["id"], self.answers[message["method"]])
        return super().answer(message)


def client_of(answers: dict[str, Any]) -> RunnerClient:
    box = LyingBox(answers)
    client = RunnerClient(lambda: Pipe(box), ping_seconds=0)
    client.connect()
    return client


def test_the_answer_table_covers_every_file_and_process_method() -> None:
    assert {row[0] for row in ANSWERS} == FILE_METHODS


@pytest.mark.parametrize(("method", "good", "bad", "message"), ANSWERS, ids=[f"{row[0]}-{row[3].split(':')[0]}"
                                                                              for row in ANSWERS])
def test_a_malformed_answer_fails_the_call_naming_method_and_field(method: str, good: dict[str, Any],
                                                                    bad: dict[str, Any], message: str) -> None:
    client = client_of({method: good})
    try:
        assert client.call(method, {}, timeout=10) == good
    finally:
        client.close()
    client = client_of({method: bad})
    try:
        with pytest.raises(P.RunnerError) as err:
            client.call(method, {}, timeout=10)
    finally:
        client.close()
    assert (err.value.code, err.value.message) == (
        P.INTERNAL_ERROR, f"the sandbox's answer to {method} is not the protocol's {message}")
    with pytest.raises(P.RunnerError) as direct:
        checked_answer(method, bad)
    assert direct.value.message == err.value.message


def test_a_bytes_page_is_told_from_a_page_of_lines_by_its_data() -> None:
    assert M.result_shape(methods.FS_READ, BYTES) is M.ReadBytesResult
    assert M.result_shape(methods.FS_READ, LINES) is M.ReadLinesResult
    assert M.result_shape(methods.FS_READ, "not an object") is M.ReadLinesResult
    assert M.result_shape("x.unheard_of", LINES) is None


# -- the spec: docs/explanation/protocols.md's table names the fields the shapes have ------------

SPEC = Path(__file__).resolve().parents[1] / "docs" / "explanation" / "protocols.md"


def named_in(cell: str) -> set[str]:
    """The field names a table cell spells: the lowercase words inside its `code` spans."""
    return {word for span in re.findall(r"`([^`]*)`", cell) for word in re.findall(r"\b[a-z][a-z0-9_]*\b", span)}


def every_field(shape: type) -> set[str]:
    """A shape's fields, and those of the shapes in its lists (`entries: [{name, ...}]`)."""
    found = set()
    for name, (spec, _) in fields(shape).items():
        found.add(name)
        if spec[0] == "list" and spec[1][0] == "shape":
            found |= every_field(spec[1][1])
    return found


@pytest.mark.parametrize("method", sorted(FILE_METHODS))
def test_the_spec_names_each_field_of_the_file_and_process_methods(method: str) -> None:
    rows = [line.split("|") for line in SPEC.read_text().splitlines() if line.startswith(f"| `{method}` |")]
    assert len(rows) == 1, f"{SPEC.name} has no row of its own for {method}"
    _, params, result = rows[0][1:4]
    assert named_in(params) - {"shell"} == set(fields(M.REQUEST_SHAPES[method])) - {"shell"}
    shapes = [M.RESULT_SHAPES[method]] + [variant for name, (_, variant) in M.RESULT_VARIANTS.items() if name == method]
    assert named_in(result) == set().union(*(every_field(shape) for shape in shapes))
