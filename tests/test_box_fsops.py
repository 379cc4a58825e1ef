"""Unit tests of the runner's file operations (`owsandbox.box.files.ops`), on real files."""

from __future__ import annotations

import base64
import hashlib
import os
import stat
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from owsandbox.box.files.ops import (
    HANDLERS,
    PAGE_CAP_BYTES,
    fs_list,
    fs_mkdir,
    fs_read,
    fs_remove,
    fs_search,
    fs_stat,
    fs_write,
    resolve_path,
)
from owsandbox.protocol import FS_ERROR, INVALID_PARAMS, RunnerError

MIB = 1024 * 1024
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fails(code: int, handler: Any, params: dict[str, Any], base: Path) -> str:
    """Calls the handler expecting a RunnerError with `code`; returns its message."""
    with pytest.raises(RunnerError) as caught:
        handler(params, str(base))
    assert caught.value.code == code, caught.value.message
    return caught.value.message


def write_lines(path: Path, count: int) -> bytes:
    data = b"".join(b"line %d\n" % n for n in range(1, count + 1))
    path.write_bytes(data)
    return data


# ---------------------------------------------------------------- paths


@pytest.mark.unit
def test_relative_path_resolves_against_base(tmp_path: Path) -> None:
    assert resolve_path("a/../b/c.txt", str(tmp_path)) == str(tmp_path / "b" / "c.txt")


@pytest.mark.unit
def test_absolute_path_ignores_base(tmp_path: Path) -> None:
    assert resolve_path(str(tmp_path / "x"), "/somewhere/else") == str(tmp_path / "x")


@pytest.mark.unit
def test_tilde_expands_to_home_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve_path("~/notes.txt", "/base") == str(tmp_path / "home" / "notes.txt")


@pytest.mark.unit
def test_handlers_table_names_every_method() -> None:
    assert HANDLERS == {"fs.read": fs_read, "fs.write": fs_write, "fs.stat": fs_stat, "fs.list": fs_list,
                        "fs.search": fs_search, "fs.mkdir": fs_mkdir, "fs.remove": fs_remove}


@pytest.mark.unit
@pytest.mark.parametrize("handler", [fs_read, fs_write, fs_stat, fs_mkdir, fs_remove])
def test_missing_path_param_is_named(tmp_path: Path, handler: Any) -> None:
    assert "'path'" in fails(INVALID_PARAMS, handler, {"text": "x"}, tmp_path)


@pytest.mark.unit
@pytest.mark.parametrize("value", [5, "", "a\0b"])
def test_bad_path_value_is_named(tmp_path: Path, value: Any) -> None:
    assert "'path'" in fails(INVALID_PARAMS, fs_stat, {"path": value}, tmp_path)


# ---------------------------------------------------------------- fs.read by lines


@pytest.mark.unit
def test_read_returns_small_file_with_counts(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_bytes(b"one\ntwo\nthree\n")
    page = fs_read({"path": "f.txt"}, str(tmp_path))
    assert page == {"path": str(tmp_path / "f.txt"), "text": "one\ntwo\nthree\n", "start_line": 1,
                    "end_line": 3, "total_lines": 3, "total_bytes": 14, "eof": True}


@pytest.mark.unit
def test_read_keeps_crlf_line_ends_exactly(tmp_path: Path) -> None:
    (tmp_path / "dos.txt").write_bytes(b"a\r\nb\r\n\r\nc\r\n")
    page = fs_read({"path": "dos.txt"}, str(tmp_path))
    assert page["text"] == "a\r\nb\r\n\r\nc\r\n"
    assert page["total_lines"] == 4


@pytest.mark.unit
def test_read_counts_last_line_without_newline(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_bytes(b"one\ntwo")
    page = fs_read({"path": "f.txt"}, str(tmp_path))
    assert (page["text"], page["end_line"], page["total_lines"], page["eof"]) == ("one\ntwo", 2, 2, True)


@pytest.mark.unit
def test_read_of_empty_file_returns_no_lines(tmp_path: Path) -> None:
    (tmp_path / "empty").write_bytes(b"")
    page = fs_read({"path": "empty"}, str(tmp_path))
    assert (page["text"], page["start_line"], page["end_line"]) == ("", 1, 0)
    assert (page["total_lines"], page["total_bytes"], page["eof"]) == (0, 0, True)


@pytest.mark.unit
def test_read_pages_through_lines(tmp_path: Path) -> None:
    write_lines(tmp_path / "f.txt", 5)
    first = fs_read({"path": "f.txt", "offset_line": 2, "limit_lines": 2}, str(tmp_path))
    assert (first["text"], first["start_line"], first["end_line"]) == ("line 2\nline 3\n", 2, 3)
    assert (first["total_lines"], first["eof"]) == (5, False)
    rest = fs_read({"path": "f.txt", "offset_line": 4, "limit_lines": 10}, str(tmp_path))
    assert (rest["text"], rest["end_line"], rest["eof"]) == ("line 4\nline 5\n", 5, True)


@pytest.mark.unit
def test_read_page_ending_on_last_line_reports_eof(tmp_path: Path) -> None:
    write_lines(tmp_path / "f.txt", 4)
    page = fs_read({"path": "f.txt", "offset_line": 3, "limit_lines": 2}, str(tmp_path))
    assert (page["end_line"], page["eof"]) == (4, True)


@pytest.mark.unit
def test_read_past_the_end_returns_nothing(tmp_path: Path) -> None:
    write_lines(tmp_path / "f.txt", 3)
    page = fs_read({"path": "f.txt", "offset_line": 10}, str(tmp_path))
    assert (page["text"], page["start_line"], page["end_line"]) == ("", 10, 9)
    assert (page["total_lines"], page["eof"]) == (3, True)


@pytest.mark.unit
def test_read_with_zero_limit_only_counts(tmp_path: Path) -> None:
    write_lines(tmp_path / "f.txt", 7)
    page = fs_read({"path": "f.txt", "limit_lines": 0}, str(tmp_path))
    assert (page["text"], page["end_line"], page["total_lines"], page["eof"]) == ("", 0, 7, False)


@pytest.mark.unit
def test_read_default_page_is_2000_lines(tmp_path: Path) -> None:
    write_lines(tmp_path / "f.txt", 2500)
    page = fs_read({"path": "f.txt"}, str(tmp_path))
    assert (page["end_line"], page["total_lines"], page["eof"]) == (2000, 2500, False)
    assert page["text"].endswith("line 2000\n")


@pytest.mark.unit
def test_read_replaces_invalid_utf8_instead_of_failing(tmp_path: Path) -> None:
    (tmp_path / "bin.txt").write_bytes(b"ok \xff\xfe end\n\xc3\xa9\n")
    page = fs_read({"path": "bin.txt"}, str(tmp_path))
    assert page["text"] == "ok \ufffd\ufffd end\n\u00e9\n"


@pytest.mark.unit
def test_read_offsets_agree_with_splitlines_across_chunk_boundaries(tmp_path: Path) -> None:
    lines = [b"%d:%s\n" % (n, b"x" * (n % 97)) for n in range(60000)]
    lines[1234] = b"crlf line\r\n"
    (tmp_path / "f.txt").write_bytes(b"".join(lines))  # ~3 MiB: skipping crosses 1 MiB read chunks
    for start in (1, 2, 1235, 20001, 41234, 59999, 60000):
        page = fs_read({"path": "f.txt", "offset_line": start, "limit_lines": 3}, str(tmp_path))
        assert page["text"] == b"".join(lines[start - 1:start + 2]).decode()
        assert page["total_lines"] == 60000


@pytest.mark.unit
def test_read_page_stops_before_line_that_would_exceed_cap(tmp_path: Path) -> None:
    line = b"y" * (400 * 1024 - 1) + b"\n"
    (tmp_path / "f.txt").write_bytes(line * 3)
    page = fs_read({"path": "f.txt"}, str(tmp_path))
    assert (page["end_line"], page["total_lines"], page["eof"]) == (2, 3, False)
    assert len(page["text"]) == 2 * len(line)


@pytest.mark.unit
def test_read_page_may_fill_cap_exactly(tmp_path: Path) -> None:
    half = b"z" * (PAGE_CAP_BYTES // 2 - 1) + b"\n"
    (tmp_path / "f.txt").write_bytes(half * 2 + b"more\n")
    page = fs_read({"path": "f.txt"}, str(tmp_path))
    assert (len(page["text"]), page["end_line"], page["eof"]) == (PAGE_CAP_BYTES, 2, False)


@pytest.mark.unit
def test_read_cuts_single_line_longer_than_cap(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_bytes(b"q" * (2 * MIB) + b"\nnext\n")
    page = fs_read({"path": "f.txt"}, str(tmp_path))
    assert page["text"] == "q" * PAGE_CAP_BYTES
    assert (page["start_line"], page["end_line"], page["total_lines"], page["eof"]) == (1, 1, 2, False)


@pytest.mark.unit
def test_read_first_page_of_large_file_streams(tmp_path: Path) -> None:
    big = tmp_path / "big.log"
    chunk = b"".join(b"%07d some log text for the line\n" % n for n in range(100000))
    with open(big, "wb") as out:
        for _ in range(20):  # 20 x 3.5 MB, about 67 MB
            out.write(chunk)
    tracemalloc.start()
    try:
        page = fs_read({"path": str(big), "limit_lines": 5}, str(tmp_path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert page["text"] == chunk[: chunk.index(b"0000005 ")].decode()
    assert page["total_lines"] == 2_000_000
    assert page["total_bytes"] == big.stat().st_size
    assert peak < 8 * MIB, f"fs.read used {peak} bytes for one page"


# ---------------------------------------------------------------- fs.read by bytes


@pytest.mark.unit
def test_read_bytes_page(tmp_path: Path) -> None:
    (tmp_path / "f.bin").write_bytes(b"0123456789")
    page = fs_read({"path": "f.bin", "offset_bytes": 3, "limit_bytes": 4}, str(tmp_path))
    assert base64.b64decode(page["data_b64"]) == b"3456"
    assert page == {"path": str(tmp_path / "f.bin"), "data_b64": page["data_b64"], "offset_bytes": 3,
                    "length": 4, "total_bytes": 10, "eof": False}


@pytest.mark.unit
def test_read_bytes_last_page_reports_eof(tmp_path: Path) -> None:
    (tmp_path / "f.bin").write_bytes(b"0123456789")
    page = fs_read({"path": "f.bin", "offset_bytes": 8, "limit_bytes": 100}, str(tmp_path))
    assert (base64.b64decode(page["data_b64"]), page["length"], page["eof"]) == (b"89", 2, True)


@pytest.mark.unit
def test_read_bytes_with_only_offset_reads_from_there(tmp_path: Path) -> None:
    (tmp_path / "f.bin").write_bytes(b"abcdef")
    page = fs_read({"path": "f.bin", "offset_bytes": 4}, str(tmp_path))
    assert (base64.b64decode(page["data_b64"]), page["eof"]) == (b"ef", True)


@pytest.mark.unit
def test_read_bytes_returns_raw_non_utf8_bytes(tmp_path: Path) -> None:
    raw = bytes(range(256))
    (tmp_path / "f.bin").write_bytes(raw)
    page = fs_read({"path": "f.bin", "limit_bytes": 1000}, str(tmp_path))
    assert base64.b64decode(page["data_b64"]) == raw


@pytest.mark.unit
def test_read_bytes_page_is_capped_at_one_mib(tmp_path: Path) -> None:
    (tmp_path / "f.bin").write_bytes(os.urandom(PAGE_CAP_BYTES + 5000))
    page = fs_read({"path": "f.bin", "limit_bytes": 5 * MIB}, str(tmp_path))
    assert (page["length"], page["eof"]) == (PAGE_CAP_BYTES, False)
    assert len(base64.b64decode(page["data_b64"])) == PAGE_CAP_BYTES


@pytest.mark.unit
def test_read_rejects_line_and_byte_paging_together(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    message = fails(INVALID_PARAMS, fs_read, {"path": "f", "offset_line": 1, "limit_bytes": 3}, tmp_path)
    assert "offset_line" in message and "limit_bytes" in message


@pytest.mark.unit
@pytest.mark.parametrize(("name", "value"), [
    ("offset_line", 0), ("offset_line", 1.5), ("offset_line", "2"), ("limit_lines", -1),
    ("limit_lines", True), ("offset_bytes", -1), ("limit_bytes", "10"), ("limit_bytes", -3),
])
def test_read_bad_paging_param_is_named(tmp_path: Path, name: str, value: Any) -> None:
    (tmp_path / "f").write_bytes(b"x")
    assert f"'{name}'" in fails(INVALID_PARAMS, fs_read, {"path": "f", name: value}, tmp_path)


@pytest.mark.unit
def test_read_missing_file_names_it(tmp_path: Path) -> None:
    message = fails(FS_ERROR, fs_read, {"path": "nope.txt"}, tmp_path)
    assert message == f"no such file: {tmp_path / 'nope.txt'}"


@pytest.mark.unit
def test_read_of_folder_says_it_is_a_folder(tmp_path: Path) -> None:
    message = fails(FS_ERROR, fs_read, {"path": "."}, tmp_path)
    assert message == f"'{tmp_path}' is a folder, not a file"


@pytest.mark.unit
def test_read_below_a_file_is_an_fs_error(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    assert str(tmp_path / "f" / "g") in fails(FS_ERROR, fs_read, {"path": "f/g"}, tmp_path)


@pytest.mark.unit
def test_read_of_fifo_fails_instead_of_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    assert "not a regular file" in fails(FS_ERROR, fs_read, {"path": "pipe"}, tmp_path)


def as_unprivileged(handler: str, params: dict[str, Any], base: Path) -> str:
    """Run a file handler as an ordinary user and return its error message (root may read anything,
    so as root the check runs as `nobody`, through the packed box and the system's python3)."""
    if not IS_ROOT:
        from owsandbox.box.files import ops as fsops

        try:
            getattr(fsops, handler)(params, str(base))
        except RunnerError as err:
            return err.message
        return ""
    import json
    import subprocess
    import tempfile

    from owsandbox.host.bundle import build_runner_zipapp

    folder = Path(tempfile.mkdtemp(prefix="owsandbox-nobody-"))
    try:
        folder.chmod(0o755)
        zipapp = build_runner_zipapp(folder)
        program = ("import json, sys; sys.path.insert(0, sys.argv[1])\n"
                   "from owsandbox import protocol\nfrom owsandbox.box.files import ops as fsops\n"
                   "try:\n    getattr(fsops, sys.argv[2])(json.loads(sys.argv[3]), sys.argv[4]); print('')\n"
                   "except protocol.RunnerError as err:\n    print(err.message)\n")
        done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3",
                               "-S", "-c", program, str(zipapp), handler, json.dumps(params), str(base)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()
    finally:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def open_folder() -> Any:
    """A folder any user can reach (pytest's own tmp folders are private to their owner)."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="owsandbox-perm-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_read_unreadable_file_says_permission_denied(open_folder: Path) -> None:
    secret = open_folder / "secret"
    secret.write_bytes(b"x")
    secret.chmod(0)
    assert as_unprivileged("fs_read", {"path": "secret"}, open_folder) == f"permission denied: {secret}"


# ---------------------------------------------------------------- fs.write


@pytest.mark.unit
def test_write_creates_file_and_reports_hash(tmp_path: Path) -> None:
    answer = fs_write({"path": "new.txt", "text": "héllo\n"}, str(tmp_path))
    data = "héllo\n".encode()
    assert (tmp_path / "new.txt").read_bytes() == data
    assert answer == {"path": str(tmp_path / "new.txt"), "bytes_written": len(data), "sha256": sha(data),
                      "size": len(data)}


@pytest.mark.unit
def test_write_keeps_crlf_in_text(tmp_path: Path) -> None:
    fs_write({"path": "dos.txt", "text": "a\r\nb\r\n"}, str(tmp_path))
    assert (tmp_path / "dos.txt").read_bytes() == b"a\r\nb\r\n"


@pytest.mark.unit
def test_write_data_b64_writes_raw_bytes(tmp_path: Path) -> None:
    raw = b"\x00\xff\xfe binary"
    answer = fs_write({"path": "f.bin", "data_b64": base64.b64encode(raw).decode()}, str(tmp_path))
    assert (tmp_path / "f.bin").read_bytes() == raw
    assert answer["sha256"] == sha(raw)


@pytest.mark.unit
def test_write_replaces_existing_content(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_bytes(b"a much longer old content\n")
    answer = fs_write({"path": "f.txt", "text": "new\n"}, str(tmp_path))
    assert (tmp_path / "f.txt").read_bytes() == b"new\n"
    assert answer["size"] == 4


@pytest.mark.unit
@pytest.mark.parametrize("params", [{}, {"text": "a", "data_b64": "YQ=="}])
def test_write_needs_exactly_one_of_text_or_data(tmp_path: Path, params: dict[str, Any]) -> None:
    message = fails(INVALID_PARAMS, fs_write, {"path": "f", **params}, tmp_path)
    assert "'text'" in message and "'data_b64'" in message
    assert not (tmp_path / "f").exists()


@pytest.mark.unit
def test_write_rejects_invalid_base64(tmp_path: Path) -> None:
    assert "'data_b64'" in fails(INVALID_PARAMS, fs_write, {"path": "f", "data_b64": "!!!"}, tmp_path)


@pytest.mark.unit
@pytest.mark.parametrize(("name", "value"), [
    ("text", 5), ("data_b64", ["x"]), ("append", "yes"), ("make_parents", 1),
    ("if_match_sha256", "abc"), ("if_match_sha256", 12), ("if_match_sha256", "g" * 64),
])
def test_write_bad_param_is_named(tmp_path: Path, name: str, value: Any) -> None:
    params = {"path": "f", "text": "x", name: value}
    if name == "data_b64":
        del params["text"]
    assert f"'{name}'" in fails(INVALID_PARAMS, fs_write, params, tmp_path)
    assert not (tmp_path / "f").exists()


@pytest.mark.unit
def test_write_with_matching_hash_succeeds(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_bytes(b"v1\n")
    fs_write({"path": "f.txt", "text": "v2\n", "if_match_sha256": sha(b"v1\n").upper()}, str(tmp_path))
    assert (tmp_path / "f.txt").read_bytes() == b"v2\n"


@pytest.mark.unit
def test_write_with_stale_hash_fails_and_leaves_file_untouched(tmp_path: Path) -> None:
    target = tmp_path / "f.txt"
    target.write_bytes(b"changed by someone else\n")
    before = target.stat()
    stale = sha(b"what the agent read\n")
    message = fails(FS_ERROR, fs_write, {"path": "f.txt", "text": "edit", "if_match_sha256": stale}, tmp_path)
    found = sha(b"changed by someone else\n")
    assert message == (f"the file changed since it was read: {target} "
                       f"(expected sha256 {stale}, found {found})")
    assert target.read_bytes() == b"changed by someone else\n"
    assert (target.stat().st_ino, target.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert os.listdir(tmp_path) == ["f.txt"]


@pytest.mark.unit
def test_write_with_hash_of_deleted_file_fails(tmp_path: Path) -> None:
    message = fails(FS_ERROR, fs_write, {"path": "gone", "text": "x", "if_match_sha256": sha(b"x")}, tmp_path)
    assert "the file changed since it was read" in message and "found no file" in message
    assert os.listdir(tmp_path) == []


@pytest.mark.unit
def test_write_with_empty_precondition_creates_new_file(tmp_path: Path) -> None:
    fs_write({"path": "fresh", "text": "x", "if_match_sha256": ""}, str(tmp_path))
    assert (tmp_path / "fresh").read_bytes() == b"x"
    assert os.listdir(tmp_path) == ["fresh"]


@pytest.mark.unit
def test_write_with_empty_precondition_refuses_existing_file(tmp_path: Path) -> None:
    (tmp_path / "taken").write_bytes(b"keep me")
    message = fails(FS_ERROR, fs_write, {"path": "taken", "text": "x", "if_match_sha256": ""}, tmp_path)
    assert message == f"{tmp_path / 'taken'} already exists"
    assert (tmp_path / "taken").read_bytes() == b"keep me"


@pytest.mark.unit
def test_append_adds_to_existing_content(tmp_path: Path) -> None:
    (tmp_path / "log").write_bytes(b"first\n")
    answer = fs_write({"path": "log", "text": "second\n", "append": True}, str(tmp_path))
    assert (tmp_path / "log").read_bytes() == b"first\nsecond\n"
    assert answer == {"path": str(tmp_path / "log"), "bytes_written": 7, "sha256": sha(b"first\nsecond\n"),
                      "size": 13}


@pytest.mark.unit
def test_append_to_missing_file_creates_it(tmp_path: Path) -> None:
    fs_write({"path": "log", "text": "only\n", "append": True}, str(tmp_path))
    assert (tmp_path / "log").read_bytes() == b"only\n"


@pytest.mark.unit
def test_append_with_matching_hash_succeeds(tmp_path: Path) -> None:
    (tmp_path / "log").write_bytes(b"a\n")
    fs_write({"path": "log", "text": "b\n", "append": True, "if_match_sha256": sha(b"a\n")}, str(tmp_path))
    assert (tmp_path / "log").read_bytes() == b"a\nb\n"


@pytest.mark.unit
def test_append_with_stale_hash_leaves_file_untouched(tmp_path: Path) -> None:
    (tmp_path / "log").write_bytes(b"a\nsurprise\n")
    params = {"path": "log", "text": "b\n", "append": True, "if_match_sha256": sha(b"a\n")}
    assert "the file changed since it was read" in fails(FS_ERROR, fs_write, params, tmp_path)
    assert (tmp_path / "log").read_bytes() == b"a\nsurprise\n"
    assert os.listdir(tmp_path) == ["log"]


@pytest.mark.unit
def test_append_with_empty_precondition_refuses_existing_file(tmp_path: Path) -> None:
    (tmp_path / "log").write_bytes(b"a\n")
    params = {"path": "log", "text": "b\n", "append": True, "if_match_sha256": ""}
    assert "already exists" in fails(FS_ERROR, fs_write, params, tmp_path)
    assert (tmp_path / "log").read_bytes() == b"a\n"


@pytest.mark.unit
def test_write_replaces_atomically_so_open_readers_keep_old_content(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_bytes(b"old content\n")
    with open(tmp_path / "f.txt", "rb") as reader:
        fs_write({"path": "f.txt", "text": "new\n"}, str(tmp_path))
        assert reader.read() == b"old content\n"  # an in-place rewrite would show the new bytes
    assert (tmp_path / "f.txt").read_bytes() == b"new\n"


@pytest.mark.unit
@pytest.mark.parametrize("mode", [0o640, 0o755, 0o600])
def test_write_keeps_permission_bits_of_existing_file(tmp_path: Path, mode: int) -> None:
    target = tmp_path / "script.sh"
    target.write_bytes(b"#!/bin/sh\n")
    target.chmod(mode)
    fs_write({"path": "script.sh", "text": "#!/bin/sh\necho hi\n"}, str(tmp_path))
    assert stat.S_IMODE(target.stat().st_mode) == mode


@pytest.mark.unit
def test_write_of_new_file_gets_umask_mode_not_temp_file_mode(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        fs_write({"path": "new.txt", "text": "x"}, str(tmp_path))
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new.txt").stat().st_mode) == 0o644


@pytest.mark.unit
def test_write_leaves_no_temp_files_behind(tmp_path: Path) -> None:
    for n in range(3):
        fs_write({"path": "f.txt", "text": f"v{n}", "append": n == 2}, str(tmp_path))
    assert os.listdir(tmp_path) == ["f.txt"]


@pytest.mark.unit
def test_write_into_missing_folder_needs_make_parents(tmp_path: Path) -> None:
    message = fails(FS_ERROR, fs_write, {"path": "a/b/f.txt", "text": "x"}, tmp_path)
    assert str(tmp_path / "a" / "b") in message and "no such folder" in message
    assert not (tmp_path / "a").exists()


@pytest.mark.unit
def test_write_with_make_parents_creates_folders(tmp_path: Path) -> None:
    fs_write({"path": "a/b/f.txt", "text": "x", "make_parents": True}, str(tmp_path))
    assert (tmp_path / "a" / "b" / "f.txt").read_bytes() == b"x"


@pytest.mark.unit
def test_write_below_a_file_is_an_fs_error(tmp_path: Path) -> None:
    (tmp_path / "plain").write_bytes(b"x")
    message = fails(FS_ERROR, fs_write, {"path": "plain/f.txt", "text": "x", "make_parents": True}, tmp_path)
    assert str(tmp_path / "plain") in message
    assert (tmp_path / "plain").read_bytes() == b"x"


@pytest.mark.unit
def test_write_to_folder_is_an_fs_error(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    message = fails(FS_ERROR, fs_write, {"path": "dir", "text": "x"}, tmp_path)
    assert message == f"'{tmp_path / 'dir'}' is a folder, not a file"
    assert (tmp_path / "dir").is_dir()


@pytest.mark.unit
def test_write_through_symlink_updates_target_and_keeps_link(tmp_path: Path) -> None:
    (tmp_path / "real.txt").write_bytes(b"old")
    (tmp_path / "link.txt").symlink_to("real.txt")
    answer = fs_write({"path": "link.txt", "text": "new"}, str(tmp_path))
    assert (tmp_path / "link.txt").is_symlink()
    assert (tmp_path / "real.txt").read_bytes() == b"new"
    assert answer["path"] == str(tmp_path / "link.txt")


@pytest.mark.unit
def test_write_resolves_tilde(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    answer = fs_write({"path": "~/in-home.txt", "text": "x"}, "/")
    assert answer["path"] == str(tmp_path / "in-home.txt")
    assert (tmp_path / "in-home.txt").read_bytes() == b"x"


def test_write_into_read_only_folder_says_permission_denied(open_folder: Path) -> None:
    locked = open_folder / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        message = as_unprivileged("fs_write", {"path": "locked/f", "text": "x"}, open_folder)
        assert "permission denied" in message and str(locked) in message
        assert not (locked / "f").exists()
    finally:
        locked.chmod(0o755)


# ---------------------------------------------------------------- fs.stat


@pytest.mark.unit
def test_stat_of_file(tmp_path: Path) -> None:
    target = tmp_path / "f.txt"
    target.write_bytes(b"content")
    target.chmod(0o640)
    answer = fs_stat({"path": "f.txt"}, str(tmp_path))
    assert answer == {"path": str(target), "exists": True, "type": "file", "size": 7, "mode": "0640",
                      "mtime": target.stat().st_mtime, "sha256": sha(b"content")}
    assert isinstance(answer["mtime"], float)


@pytest.mark.unit
def test_stat_of_folder_has_no_hash(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir(mode=0o755)
    answer = fs_stat({"path": "d"}, str(tmp_path))
    assert (answer["exists"], answer["type"], answer["mode"]) == (True, "folder", "0755")
    assert answer["sha256"] is None


@pytest.mark.unit
def test_stat_reports_symlink_itself(tmp_path: Path) -> None:
    (tmp_path / "real").write_bytes(b"x")
    (tmp_path / "link").symlink_to("real")
    answer = fs_stat({"path": "link"}, str(tmp_path))
    assert (answer["type"], answer["sha256"]) == ("symlink", None)


@pytest.mark.unit
def test_stat_of_dangling_symlink_exists(tmp_path: Path) -> None:
    (tmp_path / "link").symlink_to("nowhere")
    assert fs_stat({"path": "link"}, str(tmp_path))["exists"] is True


@pytest.mark.unit
def test_stat_of_fifo_is_other(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    assert fs_stat({"path": "pipe"}, str(tmp_path))["type"] == "other"


@pytest.mark.unit
@pytest.mark.parametrize("path", ["missing", "missing/deeper", "file/below"])
def test_stat_of_missing_path_is_not_an_error(tmp_path: Path, path: str) -> None:
    (tmp_path / "file").write_bytes(b"x")
    answer = fs_stat({"path": path}, str(tmp_path))
    assert answer == {"path": str(tmp_path / path), "exists": False, "type": None, "size": None,
                      "mode": None, "mtime": None, "sha256": None}


@pytest.mark.unit
def test_stat_hashes_files_up_to_16_mib_only(tmp_path: Path) -> None:
    with open(tmp_path / "limit", "wb") as out:
        out.truncate(16 * MIB)
    with open(tmp_path / "over", "wb") as out:
        out.truncate(16 * MIB + 1)
    assert fs_stat({"path": "limit"}, str(tmp_path))["sha256"] == sha(bytes(16 * MIB))
    over = fs_stat({"path": "over"}, str(tmp_path))
    assert (over["size"], over["sha256"]) == (16 * MIB + 1, None)


# ---------------------------------------------------------------- fs.list


@pytest.mark.unit
def test_list_sorts_entries_by_name_with_types(tmp_path: Path) -> None:
    (tmp_path / "b.txt").write_bytes(b"12345")
    (tmp_path / "a").mkdir()
    (tmp_path / ".hidden").write_bytes(b"")
    (tmp_path / "c").symlink_to("b.txt")
    answer = fs_list({"path": "."}, str(tmp_path))
    assert answer["path"] == str(tmp_path) and answer["truncated"] is False
    assert [(e["name"], e["type"]) for e in answer["entries"]] == [
        (".hidden", "file"), ("a", "folder"), ("b.txt", "file"), ("c", "symlink")]
    by_name = {e["name"]: e for e in answer["entries"]}
    assert by_name["b.txt"]["size"] == 5
    assert by_name["b.txt"]["mtime"] == (tmp_path / "b.txt").stat().st_mtime


@pytest.mark.unit
def test_list_defaults_to_base_folder(tmp_path: Path) -> None:
    (tmp_path / "only").write_bytes(b"")
    answer = fs_list({}, str(tmp_path))
    assert [e["name"] for e in answer["entries"]] == ["only"]


@pytest.mark.unit
def test_list_truncates_at_max_entries_keeping_first_names(tmp_path: Path) -> None:
    for name in ["e", "c", "a", "d", "b"]:
        (tmp_path / name).write_bytes(b"")
    answer = fs_list({"max_entries": 3}, str(tmp_path))
    assert ([e["name"] for e in answer["entries"]], answer["truncated"]) == (["a", "b", "c"], True)
    assert fs_list({"max_entries": 5}, str(tmp_path))["truncated"] is False


@pytest.mark.unit
def test_list_of_file_is_an_fs_error(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"")
    assert str(tmp_path / "f") in fails(FS_ERROR, fs_list, {"path": "f"}, tmp_path)


@pytest.mark.unit
def test_list_of_missing_folder_is_an_fs_error(tmp_path: Path) -> None:
    assert fails(FS_ERROR, fs_list, {"path": "nope"}, tmp_path) == f"no such folder: {tmp_path / 'nope'}"


@pytest.mark.unit
@pytest.mark.parametrize("value", [-1, "10", 2.5])
def test_list_bad_max_entries_is_named(tmp_path: Path, value: Any) -> None:
    assert "'max_entries'" in fails(INVALID_PARAMS, fs_list, {"max_entries": value}, tmp_path)


# ---------------------------------------------------------------- fs.search


def make_tree(root: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)


@pytest.mark.unit
def test_search_walks_tree_in_sorted_order(tmp_path: Path) -> None:
    make_tree(tmp_path, {"z.txt": b"hit z\n", "b/c.txt": b"no\nhit c\n", "b/a.txt": b"hit a\n",
                         "a.txt": b"hit 1\nmiss\nhit 3\n"})
    answer = fs_search({"pattern": "hit"}, str(tmp_path))
    assert answer["matches"] == [
        {"path": str(tmp_path / "a.txt"), "line": 1, "text": "hit 1"},
        {"path": str(tmp_path / "a.txt"), "line": 3, "text": "hit 3"},
        {"path": str(tmp_path / "b" / "a.txt"), "line": 1, "text": "hit a"},
        {"path": str(tmp_path / "b" / "c.txt"), "line": 2, "text": "hit c"},
        {"path": str(tmp_path / "z.txt"), "line": 1, "text": "hit z"},
    ]
    assert (answer["truncated"], answer["files_searched"]) == (False, 4)


@pytest.mark.unit
def test_search_uses_python_regex(tmp_path: Path) -> None:
    make_tree(tmp_path, {"f.py": b"def alpha():\nalpha = 1\ndef beta(x):\n"})
    answer = fs_search({"pattern": r"^def \w+\(", "path": "f.py"}, str(tmp_path))
    assert [m["line"] for m in answer["matches"]] == [1, 3]


@pytest.mark.unit
def test_search_match_paths_join_relative_root(tmp_path: Path) -> None:
    make_tree(tmp_path, {"src/pkg/m.py": b"needle\n"})
    answer = fs_search({"pattern": "needle", "path": "src"}, str(tmp_path))
    assert answer["matches"][0]["path"] == str(tmp_path / "src" / "pkg" / "m.py")


@pytest.mark.unit
def test_search_of_single_file(tmp_path: Path) -> None:
    make_tree(tmp_path, {"one.txt": b"x\nneedle here\n", "other.txt": b"needle\n"})
    answer = fs_search({"pattern": "needle", "path": "one.txt"}, str(tmp_path))
    assert answer == {"matches": [{"path": str(tmp_path / "one.txt"), "line": 2, "text": "needle here"}],
                      "truncated": False, "files_searched": 1}


@pytest.mark.unit
def test_search_ignore_case(tmp_path: Path) -> None:
    make_tree(tmp_path, {"f": b"Needle\nNEEDLE\nneedle\n"})
    assert len(fs_search({"pattern": "needle"}, str(tmp_path))["matches"]) == 1
    assert len(fs_search({"pattern": "needle", "ignore_case": True}, str(tmp_path))["matches"]) == 3


@pytest.mark.unit
def test_search_glob_filters_file_names(tmp_path: Path) -> None:
    make_tree(tmp_path, {"a.py": b"x\n", "b.txt": b"x\n", "sub/c.py": b"x\n"})
    answer = fs_search({"pattern": "x", "glob": "*.py"}, str(tmp_path))
    assert [m["path"] for m in answer["matches"]] == [str(tmp_path / "a.py"), str(tmp_path / "sub" / "c.py")]
    assert answer["files_searched"] == 2


@pytest.mark.unit
def test_search_skips_git_folders(tmp_path: Path) -> None:
    make_tree(tmp_path, {".git/config": b"needle\n", "sub/.git/HEAD": b"needle\n", "code": b"needle\n"})
    answer = fs_search({"pattern": "needle"}, str(tmp_path))
    assert [m["path"] for m in answer["matches"]] == [str(tmp_path / "code")]


@pytest.mark.unit
def test_search_skips_binary_files(tmp_path: Path) -> None:
    make_tree(tmp_path, {"bin": b"needle\n\x00\x01", "late-nul": b"needle\n" + b"a" * 9000 + b"\x00",
                         "text": b"needle\n"})
    answer = fs_search({"pattern": "needle"}, str(tmp_path))
    assert [m["path"] for m in answer["matches"]] == [str(tmp_path / "late-nul"), str(tmp_path / "text")]
    assert answer["files_searched"] == 2


@pytest.mark.unit
def test_search_skips_files_over_64_mib(tmp_path: Path) -> None:
    with open(tmp_path / "huge", "wb") as out:
        out.write(b"needle\n" + b"x" * 8192)
        out.truncate(64 * MIB + 1)
    make_tree(tmp_path, {"small": b"needle\n"})
    answer = fs_search({"pattern": "needle"}, str(tmp_path))
    assert [m["path"] for m in answer["matches"]] == [str(tmp_path / "small")]


@pytest.mark.unit
def test_search_skips_fifos_instead_of_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    make_tree(tmp_path, {"text": b"needle\n"})
    assert fs_search({"pattern": "needle"}, str(tmp_path))["files_searched"] == 1


@pytest.mark.unit
def test_search_truncates_at_max_matches(tmp_path: Path) -> None:
    make_tree(tmp_path, {"f": b"hit\n" * 5})
    answer = fs_search({"pattern": "hit", "max_matches": 3}, str(tmp_path))
    assert ([m["line"] for m in answer["matches"]], answer["truncated"]) == ([1, 2, 3], True)
    assert fs_search({"pattern": "hit", "max_matches": 5}, str(tmp_path))["truncated"] is False


@pytest.mark.unit
def test_search_strips_line_ends_and_cuts_long_lines(tmp_path: Path) -> None:
    make_tree(tmp_path, {"f": b"dos needle\r\n" + b"needle" + b"y" * 1000 + b"\n"})
    texts = [m["text"] for m in fs_search({"pattern": "needle"}, str(tmp_path))["matches"]]
    assert texts[0] == "dos needle"
    assert texts[1] == ("needle" + "y" * 1000)[:500]


@pytest.mark.unit
def test_search_tolerates_invalid_utf8(tmp_path: Path) -> None:
    make_tree(tmp_path, {"f": b"\xff\xfe needle \xc3\n"})
    [match] = fs_search({"pattern": "needle"}, str(tmp_path))["matches"]
    assert match["text"] == "\ufffd\ufffd needle \ufffd"


@pytest.mark.unit
def test_search_large_file_streams_line_by_line(tmp_path: Path) -> None:
    chunk = b"".join(b"%07d filler text\n" % n for n in range(100000))
    with open(tmp_path / "big", "wb") as out:
        for _ in range(5):  # 12 MB: three times the bound below, were it read whole
            out.write(chunk)
        out.write(b"the needle\n")
    tracemalloc.start()
    try:
        answer = fs_search({"pattern": "needle"}, str(tmp_path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert answer["matches"] == [{"path": str(tmp_path / "big"), "line": 500_001, "text": "the needle"}]
    assert peak < 4 * MIB, f"fs.search used {peak} bytes"


@pytest.mark.unit
def test_search_bad_regex_names_pattern_and_error(tmp_path: Path) -> None:
    message = fails(INVALID_PARAMS, fs_search, {"pattern": "foo(bar"}, tmp_path)
    assert "'pattern'" in message and "foo(bar" in message and "missing )" in message


@pytest.mark.unit
def test_search_of_missing_root_is_an_fs_error(tmp_path: Path) -> None:
    assert str(tmp_path / "nope") in fails(FS_ERROR, fs_search, {"pattern": "x", "path": "nope"}, tmp_path)


@pytest.mark.unit
@pytest.mark.parametrize(("name", "value"), [
    ("pattern", None), ("pattern", 5), ("max_matches", 0), ("max_matches", "9"), ("ignore_case", "no"),
    ("glob", 3), ("path", ""),
])
def test_search_bad_param_is_named(tmp_path: Path, name: str, value: Any) -> None:
    params = {"pattern": "x", name: value}
    if value is None:
        del params[name]
    assert f"'{name}'" in fails(INVALID_PARAMS, fs_search, params, tmp_path)


# ---------------------------------------------------------------- fs.mkdir, fs.remove


@pytest.mark.unit
def test_mkdir_creates_parents_by_default(tmp_path: Path) -> None:
    answer = fs_mkdir({"path": "a/b/c"}, str(tmp_path))
    assert answer == {"path": str(tmp_path / "a" / "b" / "c"), "created": True}
    assert (tmp_path / "a" / "b" / "c").is_dir()


@pytest.mark.unit
def test_mkdir_of_existing_folder_reports_not_created(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    assert fs_mkdir({"path": "d"}, str(tmp_path))["created"] is False


@pytest.mark.unit
def test_mkdir_without_parents_needs_the_parent(tmp_path: Path) -> None:
    message = fails(FS_ERROR, fs_mkdir, {"path": "a/b", "parents": False}, tmp_path)
    assert str(tmp_path / "a") in message
    assert not (tmp_path / "a").exists()
    assert fs_mkdir({"path": "a", "parents": False}, str(tmp_path))["created"] is True


@pytest.mark.unit
def test_mkdir_over_a_file_is_an_fs_error(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    assert str(tmp_path / "f") in fails(FS_ERROR, fs_mkdir, {"path": "f"}, tmp_path)
    assert (tmp_path / "f").read_bytes() == b"x"


@pytest.mark.unit
def test_mkdir_below_a_file_is_an_fs_error(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    fails(FS_ERROR, fs_mkdir, {"path": "f/sub"}, tmp_path)


@pytest.mark.unit
def test_mkdir_bad_parents_is_named(tmp_path: Path) -> None:
    assert "'parents'" in fails(INVALID_PARAMS, fs_mkdir, {"path": "d", "parents": "no"}, tmp_path)


@pytest.mark.unit
def test_remove_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    assert fs_remove({"path": "f"}, str(tmp_path)) == {"path": str(tmp_path / "f"), "removed": True}
    assert not (tmp_path / "f").exists()


@pytest.mark.unit
def test_remove_missing_path_reports_not_removed(tmp_path: Path) -> None:
    assert fs_remove({"path": "nope"}, str(tmp_path)) == {"path": str(tmp_path / "nope"), "removed": False}


@pytest.mark.unit
def test_remove_empty_folder_without_recursive(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    assert fs_remove({"path": "d"}, str(tmp_path))["removed"] is True
    assert not (tmp_path / "d").exists()


@pytest.mark.unit
def test_remove_non_empty_folder_needs_recursive(tmp_path: Path) -> None:
    make_tree(tmp_path, {"d/f": b"x"})
    message = fails(FS_ERROR, fs_remove, {"path": "d"}, tmp_path)
    assert f"folder not empty: {tmp_path / 'd'}" in message
    assert (tmp_path / "d" / "f").read_bytes() == b"x"


@pytest.mark.unit
def test_remove_recursive_deletes_tree(tmp_path: Path) -> None:
    make_tree(tmp_path, {"d/f": b"x", "d/e/g": b"y"})
    assert fs_remove({"path": "d", "recursive": True}, str(tmp_path))["removed"] is True
    assert not (tmp_path / "d").exists()


@pytest.mark.unit
def test_remove_symlink_to_folder_keeps_the_folder(tmp_path: Path) -> None:
    make_tree(tmp_path, {"real/f": b"x"})
    (tmp_path / "link").symlink_to("real")
    assert fs_remove({"path": "link", "recursive": True}, str(tmp_path))["removed"] is True
    assert not os.path.lexists(tmp_path / "link")
    assert (tmp_path / "real" / "f").read_bytes() == b"x"


@pytest.mark.unit
def test_remove_bad_recursive_is_named(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    assert "'recursive'" in fails(INVALID_PARAMS, fs_remove, {"path": "d", "recursive": 1}, tmp_path)
    assert (tmp_path / "d").exists()
