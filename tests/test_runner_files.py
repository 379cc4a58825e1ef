"""Files and argv processes through the daemon, and the daemon's memory under a flood of output."""

from __future__ import annotations

import base64
import hashlib
import os

import pytest

from owsandbox import protocol as P
from owsandbox.host.executor import RunnerExecutor

from .conftest import box_with_release


@pytest.fixture(params=["local", "bwrap", "ssh", "opensandbox", "opensandbox-release", "opensandbox-external"])
def box(request: pytest.FixtureRequest, zipapp, workspace):
    """conftest's `box`, and through a released execd as well (release mode)."""
    yield from box_with_release(request, zipapp, workspace)


def daemon_host_pid(provider) -> int:
    """The daemon's pid as this machine sees it (inside a PID namespace it has another): the process
    serving the provider's socket, or in a bubblewrap box the `serve` below the namespace's init."""
    from owsandbox.host.providers.local import descendants

    candidates = descendants(provider.daemon_pid) if provider.name == "bwrap" else [int(n) for n in os.listdir("/proc")
                                                                                    if n.isdigit()]
    for pid in candidates:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"serve" in argv and not argv[0].endswith(b"bwrap") and (
                provider.name == "bwrap" or provider.socket_path.encode() in argv):
            return pid
    raise AssertionError(f"no daemon serving {provider.socket_path}")


def test_a_file_is_read_in_pages_of_lines_and_of_bytes(box, workspace):
    _, client = box
    (workspace / "log.txt").write_text("".join(f"row {i}\n" for i in range(1, 501)))
    page = client.call("fs.read", {"path": "log.txt", "offset_line": 20, "limit_lines": 3}, timeout=10)
    assert page["text"] == "row 20\nrow 21\nrow 22\n"
    assert (page["start_line"], page["end_line"], page["total_lines"], page["eof"]) == (20, 22, 500, False)
    last = client.call("fs.read", {"path": "log.txt", "offset_line": 499, "limit_lines": 10}, timeout=10)
    assert last["text"] == "row 499\nrow 500\n" and last["eof"] is True
    raw = client.call("fs.read", {"path": "log.txt", "offset_bytes": 4, "limit_bytes": 3}, timeout=10)
    assert base64.b64decode(raw["data_b64"]) == b"1\nr" and raw["eof"] is False and raw["length"] == 3


def test_line_ends_are_kept_as_they_are(box, workspace):
    _, client = box
    (workspace / "dos.txt").write_bytes(b"one\r\ntwo\r\n")
    assert client.call("fs.read", {"path": "dos.txt"}, timeout=10)["text"] == "one\r\ntwo\r\n"


def test_a_write_with_a_stale_hash_is_refused_and_leaves_the_file_alone(box, workspace):
    _, client = box
    first = client.call("fs.write", {"path": "note.txt", "text": "first\n", "if_match_sha256": ""}, timeout=10)
    assert first["sha256"] == hashlib.sha256(b"first\n").hexdigest()
    second = client.call("fs.write", {"path": "note.txt", "text": "second\n", "if_match_sha256": first["sha256"]},
                         timeout=10)
    with pytest.raises(P.RunnerError) as err:
        client.call("fs.write", {"path": "note.txt", "text": "third\n", "if_match_sha256": first["sha256"]}, timeout=10)
    assert err.value.code == P.FS_ERROR and "changed since it was read" in err.value.message
    assert (workspace / "note.txt").read_text() == "second\n"
    with pytest.raises(P.RunnerError, match="already exists"):
        client.call("fs.write", {"path": "note.txt", "text": "new\n", "if_match_sha256": ""}, timeout=10)
    appended = client.call("fs.write", {"path": "note.txt", "text": "more\n", "append": True,
                                        "if_match_sha256": second["sha256"]}, timeout=10)
    assert (workspace / "note.txt").read_text() == "second\nmore\n"
    assert appended["sha256"] == hashlib.sha256(b"second\nmore\n").hexdigest()


def test_reading_a_folder_or_a_missing_file_names_the_path(box, workspace):
    _, client = box
    (workspace / "sub").mkdir()
    for path in ("sub", "missing.txt"):
        with pytest.raises(P.RunnerError) as err:
            client.call("fs.read", {"path": path}, timeout=10)
        assert err.value.code == P.FS_ERROR and str(workspace / path) in err.value.message
    with pytest.raises(P.RunnerError) as err:
        client.call("fs.read", {"path": "x", "offset_line": "one"}, timeout=10)
    assert err.value.code == P.INVALID_PARAMS and "offset_line" in err.value.message


def test_search_finds_lines_by_pattern(box, workspace):
    _, client = box
    (workspace / "a.txt").write_text("".join(f"item {i}\n" for i in range(1, 301)))
    (workspace / "b.bin").write_bytes(b"item 250\x00binary")
    found = client.call("fs.search", {"pattern": r"^item 25\d$"}, timeout=10)
    assert [(m["path"].rsplit("/", 1)[-1], m["line"]) for m in found["matches"]] == \
        [("a.txt", n) for n in range(250, 260)]
    assert found["truncated"] is False
    capped = client.call("fs.search", {"pattern": "item", "max_matches": 5}, timeout=10)
    assert len(capped["matches"]) == 5 and capped["truncated"] is True
    with pytest.raises(P.RunnerError) as err:
        client.call("fs.search", {"pattern": "(unclosed"}, timeout=10)
    assert err.value.code == P.INVALID_PARAMS


def test_relative_paths_resolve_against_the_named_shells_folder(box, workspace):
    _, client = box
    (workspace / "inside").mkdir()
    RunnerExecutor(client, cwd=str(workspace), shell="worker").run("cd inside && echo hi > here.txt")
    assert client.call("fs.read", {"path": "here.txt", "shell": "worker"}, timeout=10)["text"] == "hi\n"
    listing = client.call("fs.list", {"path": ".", "shell": "worker"}, timeout=10)
    assert [e["name"] for e in listing["entries"]] == ["here.txt"]
    stat = client.call("fs.stat", {"path": "here.txt", "shell": "worker"}, timeout=10)
    assert stat["exists"] is True and stat["type"] == "file" and stat["size"] == 3
    with pytest.raises(P.RunnerError) as err:
        client.call("fs.read", {"path": "here.txt", "shell": "nobody"}, timeout=10)
    assert err.value.code == P.UNKNOWN_SHELL


def test_proc_run_takes_argv_and_expands_nothing(box, workspace):
    _, client = box
    done = client.call("proc.run", {"argv": ["printf", "%s|", "two words", "$HOME", "*"]}, timeout=10)
    assert done["exit_code"] == 0 and done["stdout"] == "two words|$HOME|*|" and done["timed_out"] is False
    fed = client.call("proc.run", {"argv": ["sh", "-c", "cat; echo oops >&2; exit 4"], "stdin": "fed\n"}, timeout=10)
    assert (fed["exit_code"], fed["stdout"], fed["stderr"]) == (4, "fed\n", "oops\n")
    where = client.call("proc.run", {"argv": ["pwd"]}, timeout=10)
    assert where["stdout"].strip() == str(workspace)


def test_the_daemon_stays_small_while_a_command_floods_it(box):
    """300 MB of output: the daemon's memory stays bounded (the benchmark measures 1 GB)."""
    provider, client = box
    pid = daemon_host_pid(provider)
    peak = 0
    frames = 0

    def watch(frame: dict) -> None:
        nonlocal peak, frames
        frames += 1
        if frames % 50 == 0:
            with open(f"/proc/{pid}/status") as f:
                rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
            peak = max(peak, rss)

    result = client.call("shell.run", {"command": "head -c 300000000 /dev/zero | tr '\\0' 'x' | fold -w 99"},
                         timeout=300, on_notification=watch)
    assert result["exit_code"] == 0 and result["truncated"] is True
    assert result["output_bytes"] == 300000000 + 300000000 // 99  # fold adds no newline to the last part
    assert frames > 100 and 0 < peak < 100 * 1024  # kB
