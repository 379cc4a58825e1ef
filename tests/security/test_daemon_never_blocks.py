"""The attack: a search whose regex backtracks catastrophically must not freeze the sandbox's daemon.

`(a+)+$` over one line of 36 `a` and a `b` keeps Python's `re` busy for minutes, holding the GIL all
the while. When the daemon ran `fs.search` in its own process, that froze every thread of it: other
shells' cells, `shell.list` (`%shells`) and `shell.interrupt` (Stop) went unanswered until the match
gave up. Now the search runs in a child process with a deadline: everything else is answered while
it runs, the search ends at its deadline with an error saying why, and the child is killed and reaped.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest

from owsandbox import protocol as P
from owsandbox.box.files import search as searchchild
from owsandbox.box.files.ops import fs_search
from owsandbox.host.providers.local import LocalProvider
from tests.processes import children, command_line, descendants
from tests.waiting import WaitTimeout, wait_until

from ..conftest import running

CATASTROPHIC = "(a+)+$"
BAD_LINE = "a" * 36 + "b\n"
SEARCH_LIMIT_S = 4.0  # the attack's deadline: short, yet far longer than the other calls need
ANSWER_BOUND_S = 2.0  # what "answers at once" means for each of the other calls, on a busy machine too
CHILD_MARK = "files.search import child_main"  # in the command line of the daemon's search process


@pytest.fixture
def local_box(zipapp: Path, workspace: Path):
    """A real daemon from the real zipapp, run on this machine so that /proc shows its processes."""
    with running(LocalProvider(cwd=workspace, runner_path=zipapp, relay_silence_seconds=0)) as pair:
        yield pair


def search_children(pid: int, below: Callable[[int], list[int]] = children) -> list[int]:
    """The search processes among the children (or, with `below=descendants`, all descendants) of `pid`."""
    return [child for child in below(pid) if CHILD_MARK in command_line(child)]


def wait_for_search_child(pid: int, timeout: float, below: Callable[[int], list[int]] = children) -> list[int]:
    """The search processes below `pid` once one shows (polling /proc: no event says a process began);
    [] if none did within `timeout`."""
    with suppress(WaitTimeout):
        return wait_until(lambda: search_children(pid, below), timeout, "a search process", interval=0.01)
    return []


def answered(client: Any, method: str, params: dict[str, Any]) -> tuple[Any, float]:
    """The answer to `method` and how long it took; a failure if it took more than ANSWER_BOUND_S."""
    asked = time.monotonic()
    try:
        value = client.call(method, params, timeout=ANSWER_BOUND_S)
    except TimeoutError:
        pytest.fail(f"{method} did not answer within {ANSWER_BOUND_S:g} s while the search ran: the daemon is blocked")
    return value, time.monotonic() - asked


def test_a_catastrophic_search_blocks_neither_other_shells_nor_the_listing_nor_stop(local_box, workspace):
    _provider, client = local_box
    daemon = client.hello["pid"]
    (workspace / "bad.txt").write_text(BAD_LINE)
    started = threading.Event()
    busy = client.start_call("shell.run", {"shell": "busy", "command": "echo started; sleep 60"},
                             on_notification=lambda frame: "started" in frame.get("text", "") and started.set())
    assert started.wait(30), "the command to stop later never started"
    # The other shell is opened first: starting a bash beside the search's busy core is not what is timed.
    assert client.call("shell.run", {"shell": "other", "command": "true"}, timeout=30)["exit_code"] == 0

    asked = time.monotonic()
    search = client.start_call("fs.search", {"pattern": CATASTROPHIC, "path": "bad.txt", "timeout_s": SEARCH_LIMIT_S})
    searching = wait_for_search_child(daemon, 5)  # not asserted yet: a blocked daemon shows in the calls below

    ran, run_s = answered(client, "shell.run", {"shell": "other", "command": "echo hi"})
    assert ran["output"] == "hi\n" and ran["exit_code"] == 0
    listing, list_s = answered(client, "shell.list", {})
    shells = {shell["name"]: shell for shell in listing["shells"]}
    assert shells["busy"]["busy"] is True and shells["other"]["busy"] is False
    stopped, stop_s = answered(client, "shell.interrupt", {"shell": "busy"})
    assert stopped == {"shell": "busy", "interrupted": True, "state": "running"}
    assert client.wait(busy, ANSWER_BOUND_S)["error"].startswith("interrupted")

    assert searching, "fs.search did not start a process of its own: it runs inside the daemon"
    assert not search.done(), "the other calls were answered only after the search ended"
    assert search_children(daemon) == searching, "the search process ended before the other calls were answered"
    print(f"\n[measure] while the catastrophic search ran: shell.run (another shell) {run_s * 1000:.0f} ms, "
          f"shell.list {list_s * 1000:.1f} ms, shell.interrupt {stop_s * 1000:.1f} ms")

    with pytest.raises(P.RunnerError) as failed:
        client.wait(search, SEARCH_LIMIT_S + 10)
    took = time.monotonic() - asked
    assert failed.value.code == P.FS_ERROR
    assert f"took longer than {SEARCH_LIMIT_S:g} s and was stopped" in failed.value.message
    assert "backtrack catastrophically" in failed.value.message
    assert failed.value.data == {"path": str(workspace / "bad.txt"), "timeout_s": SEARCH_LIMIT_S}
    assert SEARCH_LIMIT_S - 0.5 < took < SEARCH_LIMIT_S + 5

    # Killed and reaped before the answer went out: not even a zombie is left; only the shells remain.
    shell_pids = {shell["pid"] for shell in client.call("shell.list", {}, timeout=10)["shells"]}
    assert set(children(daemon)) == shell_pids, [command_line(pid) for pid in children(daemon)]
    assert client.call("shell.run", {"shell": "busy", "command": "echo after"}, timeout=10)["output"] == "after\n"


def test_an_ordinary_search_answers_as_before(local_box, workspace):
    """Through the daemon (so through its child), the answers and errors of fsops' own fs_search."""
    _provider, client = local_box
    (workspace / "src").mkdir()
    (workspace / "src" / "a.py").write_text("def one():\n    return 1\ndef two():\n")
    (workspace / "b.txt").write_text("".join(f"item {i}\n" for i in range(1, 301)) + "caf\xe9 d\xe9f\n")
    (workspace / "c.bin").write_bytes(b"def x\x00")
    (workspace / "odd.txt").write_bytes(b"def \xff\xfe\r\n")
    (workspace / os.fsdecode(b"n\xffme.txt")).write_text("def z\n")  # a name that is not UTF-8
    for params in ({"pattern": r"^def \w+"}, {"pattern": "DEF", "ignore_case": True, "glob": "*.py"},
                   {"pattern": "item", "max_matches": 7}, {"pattern": "item 2", "path": "b.txt"},
                   {"pattern": "d\xe9f"}, {"pattern": "nothing here", "timeout_s": 10}):
        assert client.call("fs.search", params, timeout=30) == fs_search(params, str(workspace)), params
    for params in ({"pattern": "(unclosed"}, {"pattern": "x", "path": "missing"}, {"pattern": "x", "max_matches": 0},
                   {"pattern": 5}, {"pattern": "x", "glob": 3}):
        with pytest.raises(P.RunnerError) as failed:
            client.call("fs.search", params, timeout=30)
        with pytest.raises(P.RunnerError) as in_process:
            fs_search(params, str(workspace))
        assert failed.value.to_json() == in_process.value.to_json(), params
    for bad in (0, -1, "soon", True):
        with pytest.raises(P.RunnerError) as failed:
            client.call("fs.search", {"pattern": "x", "timeout_s": bad}, timeout=30)
        assert failed.value.code == P.INVALID_PARAMS and "'timeout_s'" in failed.value.message
    assert client.call("fs.search", {"pattern": "def z", "timeout_s": 1e300}, timeout=30)["matches"]


def test_the_search_process_starts_from_a_source_tree_too(tmp_path):
    """As when the daemon runs as `python -m owsandbox.box`: the child comes from the package's
    folder, not the zipapp; a catastrophic search is stopped and its process reaped there too."""
    (tmp_path / "bad.txt").write_text(BAD_LINE)
    (tmp_path / "good.txt").write_text("needle\n")
    assert searchchild.fs_search_in_child({"pattern": "needle"}, str(tmp_path)) == \
        fs_search({"pattern": "needle"}, str(tmp_path))
    asked = time.monotonic()
    with pytest.raises(P.RunnerError) as failed:
        searchchild.fs_search_in_child({"pattern": CATASTROPHIC, "path": "bad.txt", "timeout_s": 1}, str(tmp_path))
    assert failed.value.code == P.FS_ERROR and "took longer than 1 s" in failed.value.message
    assert time.monotonic() - asked < 5
    assert search_children(os.getpid()) == []


def test_the_answer_read_from_the_search_process_is_bounded(tmp_path, monkeypatch):
    (tmp_path / "many.txt").write_text("hit\n" * 5000)
    monkeypatch.setattr(searchchild, "ANSWER_CAP_BYTES", 10_000)
    with pytest.raises(P.RunnerError) as failed:
        searchchild.fs_search_in_child({"pattern": "hit", "max_matches": 5000}, str(tmp_path))
    assert failed.value.code == P.FS_ERROR and "max_matches" in failed.value.message
    assert searchchild.fs_search_in_child({"pattern": "hit", "max_matches": 10}, str(tmp_path))["truncated"] is True


def test_a_catastrophic_percent_search_is_a_cell_error_naming_the_time_limit(fresh_kernel, tmp_path):
    """Through the kernel: `%timeout` bounds the search, `%shells` answers while it runs, and the cell
    ends with an error naming the limit."""
    (tmp_path / "bad.txt").write_text(BAD_LINE)
    assert fresh_kernel.run("echo ready").status == "ok"  # the sandbox is up
    assert fresh_kernel.run("%timeout 3").status == "ok"
    cell = fresh_kernel.send(f"%search '{CATASTROPHIC}' bad.txt")
    searching = wait_for_search_child(fresh_kernel.pid, 5, below=descendants)  # a blocked daemon shows below
    asked = time.monotonic()
    shells = fresh_kernel.control("execute_request", {"code": "%shells", "silent": False}, timeout=30)
    shells_s = time.monotonic() - asked
    assert shells["content"]["status"] == "ok", shells["content"]
    assert shells_s < ANSWER_BOUND_S, f"%shells took {shells_s:.1f} s while the search ran"
    assert searching, "%search did not start a process of its own: it runs inside the daemon"
    print(f"\n[measure] %shells answered in {shells_s * 1000:.0f} ms while the catastrophic %search ran")
    run = fresh_kernel.collect(cell, timeout=30)
    assert run.status == "error"
    assert "took longer than 3 s and was stopped" in run.error["evalue"], run.error
    assert fresh_kernel.run("echo after").text() == "after\n"
