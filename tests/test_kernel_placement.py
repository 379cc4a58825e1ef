"""A cell magic below the first line is refused by name and line; `%%` lines that are bash's own text are not."""

from __future__ import annotations

import pytest

from owsandbox.kernel.errors import UsageError
from owsandbox.kernel.magics.placement import refuse_misplaced_cell_magic
from owsandbox.kernel.magics.table import all_magics

CELL_MAGICS = [found.name for found in all_magics().values() if found.kind == "cell"]


@pytest.mark.unit
@pytest.mark.parametrize(("code", "line", "spelled"), [
    ("cd x\n%%write hello.txt\nhi", 2, "%%write"),
    ("cd x\n  %%shell other\necho", 2, "%%shell"),
    ("echo one\necho two\n%%send", 3, "%%send"),
    ("if true; then\n%%write a\nfi", 2, "%%write"),
    ("cat <<EOF\nin the document\nEOF\n%%write after.txt", 4, "%%write"),
])
def test_a_known_cell_magic_on_a_command_line_below_the_first_is_named_with_its_line(code, line, spelled):
    with pytest.raises(UsageError) as refused:
        refuse_misplaced_cell_magic(code, CELL_MAGICS)
    message = str(refused.value)
    assert message.startswith(f"{spelled} is a cell magic") and "first line of the cell" in message
    assert f"on line {line} " in message


@pytest.mark.unit
@pytest.mark.parametrize("code", [
    "cat <<EOF\n%%write x\nEOF",  # a here-document's text
    "cat <<-'END'\n\t%%shell other\n\tEND",
    "echo \"a\n%%write x\"",  # a quoted string's
    "echo 'a\n%%write x'",
    "echo \\\n%%write x",  # a continued line's arguments
    "x=$(\n%%write y\n)",  # a substitution's
    "cd x\n%%nosuch y",  # not a magic the kernel knows: bash's to answer
    "echo %%write x",  # not at the start of a line
    "cd x\n%%writer y",
    "printf '%%s\\n' a",
])
def test_a_double_percent_line_that_is_bash_text_or_no_known_magic_passes(code):
    refuse_misplaced_cell_magic(code, CELL_MAGICS)


@pytest.mark.unit
def test_the_line_counts_from_the_cells_first_line():
    with pytest.raises(UsageError, match="on line 5 "):
        refuse_misplaced_cell_magic("ls\n%%write x", CELL_MAGICS, first_line=4)


def test_a_cell_magic_on_line_two_is_an_error_through_the_kernel_and_nothing_runs(fresh_kernel, tmp_path):
    (tmp_path / "x").mkdir()
    run = fresh_kernel.run("cd x\n%%write hello.txt\nhello")
    assert run.status == "error" and run.error["ename"] == "UsageError", run.outputs
    assert "%%write is a cell magic" in run.error["evalue"] and "on line 2 " in run.error["evalue"]
    assert run.text("stderr") == "" and "no job control" not in str(run.outputs)
    assert fresh_kernel.run("pwd").text() == f"{tmp_path}\n"  # the cd did not run either
    assert not (tmp_path / "x" / "hello.txt").exists() and not (tmp_path / "hello.txt").exists()
    after_magic = fresh_kernel.run("%timeout 5\necho ran\n%%shell other")  # below line magics: the line in the cell
    assert after_magic.status == "error" and "%%shell" in after_magic.error["evalue"]
    assert "on line 3 " in after_magic.error["evalue"]
    assert fresh_kernel.run("%timeout").text() == "cell time limit: off\n"
    in_shell = fresh_kernel.run("%%shell other\ncd x\n%%write y.txt")  # a %%shell cell's body is shell text too
    assert in_shell.status == "error" and "on line 3 " in in_shell.error["evalue"]
    heredoc = fresh_kernel.run("cat <<'EOF'\n%%write not-a-magic\nEOF")
    assert heredoc.status == "ok" and heredoc.text() == "%%write not-a-magic\n"
