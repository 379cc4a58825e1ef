"""Completion and inspection through the whole runner (`shell.complete`, `shell.inspect`): a fresh bash
that knows the shell's functions, aliases and PATH, in every kind of box, and shells that never notice."""

from __future__ import annotations

import threading
import time

from owsandbox.host.executor import RunnerExecutor

from .waiting import patience


def complete(client, word: str, shell: str = "main", what: str = "commands") -> list[str]:
    return client.call("shell.complete", {"shell": shell, "what": what, "word": word}, timeout=15)["matches"]


def test_a_fresh_bash_knows_the_functions_aliases_and_path_of_the_shell(box, workspace):
    _, client = box
    tool = workspace / "bin" / "my-own-tool"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    ex = RunnerExecutor(client, cwd=str(workspace))
    assert ex.run("export PATH=$PWD/bin:$PATH; box_fn() { echo in-box; }; alias box_al='ls -l'")["exit_code"] == 0
    assert complete(client, "box_") == ["box_al", "box_fn"]
    assert complete(client, "my-own") == ["my-own-tool"]
    assert "echo in-box" in client.call("shell.inspect", {"shell": "main", "word": "box_fn"}, timeout=15)["text"]
    assert complete(client, "box_", shell="not-started") == []
    assert complete(client, "owdisp", shell="not-started") == ["owdisplay"]


def test_completion_between_and_during_commands_never_changes_what_they_print(box, workspace):
    _, client = box
    ex = RunnerExecutor(client, cwd=str(workspace), shell="race")
    assert ex.run("true")["exit_code"] == 0
    stop = threading.Event()
    answers: list[list[str]] = []

    def ask() -> None:
        while not stop.is_set():
            answers.append(complete(client, "race_", shell="race"))

    asker = threading.Thread(target=ask)
    asker.start()
    try:
        for i in range(1000):  # at least 60 commands, and at least 10 completions among them
            result = ex.run(f"echo $? {i}; race_{i}() {{ :; }}; (exit {i % 3})")
            assert (result["output"], result["exit_code"]) == (f"{(i - 1) % 3 if i else 0} {i}\n", i % 3)
            if i >= 59 and len(answers) >= 10:
                break
    finally:
        stop.set()
        asker.join()
    assert len(answers) >= 10 and f"race_{i}" in complete(client, f"race_{i}", shell="race")
    assert ex.run("echo $?")["output"] == f"{i % 3}\n"


def test_a_shell_asked_once_writes_its_definitions_again_when_idle_after_a_command(box, workspace):
    """So that a Tab while a cell runs knows what the cells before it defined."""
    _, client = box
    ex = RunnerExecutor(client, cwd=str(workspace), shell="idle")
    assert ex.run("true")["exit_code"] == 0
    assert complete(client, "later_", shell="idle") == []  # asked once
    assert ex.run("later_fn() { :; }")["exit_code"] == 0
    time.sleep(0.3)  # the pause between two cells run by a person, the moment the shell writes them in
    busy: dict = {}
    worker = threading.Thread(target=lambda: busy.update(ex.run("sleep 2; echo done")))
    worker.start()
    try:
        deadline = time.monotonic() + patience(10)
        while not any(s["name"] == "idle" and s["busy"] for s in client.call("shell.list", timeout=5)["shells"]):
            assert time.monotonic() < deadline, "the shell never became busy"
            time.sleep(0.01)
        assert complete(client, "later_", shell="idle") == ["later_fn"]
    finally:
        worker.join()
    assert busy["output"] == "done\n"


def test_a_tab_while_the_shell_rewrites_its_definitions_still_knows_every_name(box, workspace):
    """The shell rewrites its definitions a moment after each command, while a Tab may be reading
    them: the Tab must read the old file or the new one, never one half written. A big library of
    functions makes each rewrite take a while, and Tabs come at every moment of it."""
    _, client = box
    ex = RunnerExecutor(client, cwd=str(workspace), shell="rewrite")
    library = "for n in $(seq 1000); do eval \"lib_$n() { echo $n; echo more; echo lines; }\"; done"
    assert ex.run(library)["exit_code"] == 0
    assert complete(client, "lib_300", shell="rewrite")[:1] == ["lib_300"]
    for i in range(40):
        assert ex.run(f"late_{i}() {{ :; }}")["exit_code"] == 0
        time.sleep(i % 8 * 0.01)  # before, at and after the moment the shell writes them again
        assert f"late_{i}" in complete(client, "late_", shell="rewrite"), f"after command {i}"
