"""`%%check`: its core without I/O (kernel/teaching/checks.py), its script in a real interactive bash against a
student's shell that tries to make it pass, and the magic through a real kernel."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from owsandbox.kernel.teaching.checks import (
    Check,
    Outcome,
    check_script,
    finding,
    parse_checks,
    read_outcomes,
    report,
    sentence,
    split_comment,
)

TOKEN = "owchecktest0123"


def framed(number: int, status: int, found: str = "") -> str:
    return f"\n{TOKEN}:begin {number} {status}\n{found}\n{TOKEN}:end\n"


def done(count: int) -> str:
    return f"\n{TOKEN}:done {count}\n"


# -- the core ------------------------------------------------------------------------------------

@pytest.mark.unit
def test_a_cell_becomes_tests_one_command_each_with_its_comment():
    body = ("# a comment line is no test\n\nexpect_file a.txt  # a.txt should be there\n"
            "if [[ -d x ]]; then\n  true\nfi\n[[ $top == 'a # b' ]]\necho one \\\n  two\n")
    found = parse_checks(body)
    assert found == [Check(0, "expect_file a.txt", 3, "a.txt should be there"),
                     Check(1, "if [[ -d x ]]; then\n  true\nfi", 4, ""),
                     Check(2, "[[ $top == 'a # b' ]]", 7, ""),
                     Check(3, "echo one \\\n  two", 8, "")]
    assert parse_checks("\n  \n# only comments\n") == []
    assert split_comment("echo ${#x} # length") == ("echo ${#x}", "length")
    assert split_comment('echo "#not" \\# no') == ('echo "#not" \\# no', "")


@pytest.mark.unit
def test_outcomes_are_read_in_order_once_each_and_to_the_end():
    checks = parse_checks("true\nfalse\nexpect_var top banana\n")
    output = framed(0, 0) + framed(1, 1) + framed(2, 1, "var\x1ftop\x1fapple\x1fbanana") + done(3)
    outcomes, problem = read_outcomes(output, TOKEN, checks)
    assert problem is None and [o.status for o in outcomes] == [0, 1, 1]
    assert finding(outcomes[2].found) == "$top is 'apple', not 'banana'"
    lines = report(outcomes, problem, points=2)
    assert lines.lines == ["✗ false (exit status 1)", "✗ expect_var top banana: $top is 'apple', not 'banana'"]
    assert lines.summary == "2 of 3 checks failed (0 of 2 points)" and not lines.ok


@pytest.mark.unit
def test_a_report_that_is_not_whole_fails_closed():
    checks = parse_checks("true\ntrue\n")
    twice, problem = read_outcomes(framed(0, 0) + framed(0, 0) + framed(1, 0) + done(2), TOKEN, checks)
    assert twice[0].status is None and "reported twice" in problem
    unfinished, problem = read_outcomes(framed(0, 0), TOKEN, checks)
    assert [o.status for o in unfinished] == [0, None] and "did not run to its end" in problem
    forged, problem = read_outcomes(framed(0, 0).replace(TOKEN, "someone-else") + framed(1, 0) + done(2), TOKEN,
                                    checks)
    assert forged[0].status is None and problem == "the check's report came out of order"
    assert not report(forged, problem).ok
    nothing, problem = read_outcomes("", TOKEN, checks)
    assert report(nothing, problem).summary == "2 of 2 checks failed"


@pytest.mark.unit
def test_sentences_are_plain_and_a_hint_is_said_once():
    check = Check(0, "expect_file answers/count.txt --contains 8", 1)
    missing = Outcome(check, 1, ["missing", "answers/count.txt"])
    assert sentence(missing) == "✗ expect_file answers/count.txt --contains 8: answers/count.txt does not exist"
    assert sentence(missing, "count the lines with wc -l") == "✗ count the lines with wc -l"
    lacks = finding(["lacks", "a.txt", "8", "7\n" + "x" * 100])
    assert lacks == "a.txt does not contain '8' (it holds '7\\n" + "x" * 57 + "…')"
    assert finding(["output", "wc -l < f", "3", "8", "1"]) == "it printed '3', not '8'"
    assert finding(["status", "grep -q x f", "1", "0"]) == "it exited with status 1, not 0"
    two = [Outcome(Check(n, f"test {n}", n + 1), 1) for n in range(2)]
    assert report(two, hint="look at part 2 again").lines == ["✗ look at part 2 again"]
    passed = report([Outcome(Check(0, "true", 1), 0)], points=1)
    assert passed.ok and passed.lines == ["✓ 1 check passed (1 point)"]


# -- the script, in a real bash ------------------------------------------------------------------

def run_in_bash(prefix: str, body: str, folder: Path) -> tuple[list[Outcome], str | None, str]:
    """The check's script run by an interactive bash after `prefix` (the student's work), then what the
    student's shell looks like afterwards."""
    checks = parse_checks(body)
    after = "\necho \"after: $PWD $top $(type -t expect_file) $(alias | wc -l)\"\n"
    done_ = subprocess.run(["bash", "--norc", "-i"], input=prefix + "\n" + check_script(checks, TOKEN) + after,
                           capture_output=True, text=True, cwd=folder, timeout=30)
    outcomes, problem = read_outcomes(done_.stdout, TOKEN, checks)
    return outcomes, problem, done_.stdout.rsplit("after: ", 1)[-1].strip()


def test_checks_see_the_students_state_and_change_none_of_it(tmp_path):
    (tmp_path / "answers").mkdir()
    (tmp_path / "answers" / "count.txt").write_text("8\n")
    body = """expect_file answers/count.txt --contains 8
expect_var top banana
expect_output 'has_fruit apple && echo yes' yes
expect_status 'has_fruit mango' 1
[[ $PWD == */answers ]]
cd / ; export top=changed; exit 3
expect_output 'cat answers/count.txt' 9"""
    prefix = "top=banana; has_fruit() { grep -qx -- \"$1\" <<< $'apple\\nbanana'; }; cd answers; cd .."
    outcomes, problem, after = run_in_bash(prefix, body, tmp_path)
    assert problem is None
    assert [o.status for o in outcomes] == [0, 0, 0, 0, 1, 3, 1]
    assert finding(outcomes[6].found) == "it printed '8', not '9'"
    assert after == f"{tmp_path} banana  0"  # folder, variable, no helper left behind, no alias


def test_a_student_cannot_make_a_check_pass_by_name(tmp_path):
    """Aliases and functions named like the helpers or the builtins the script uses, and a read-only
    variable of the script's: each makes the check fail, none makes it pass."""
    body = "expect_file nowhere.txt\nexpect_var top banana\nfalse"
    for prefix in ("alias expect_file=true expect_var=true false=true",
                   "expect_file() { return 0; }; expect_var() { :; }; false() { :; }",
                   "unset() { :; }; builtin() { :; }; printf() { :; }; eval() { :; }",
                   "alias if='echo' function='echo'",
                   f"readonly __ow_token={TOKEN}",
                   "readonly POSIXLY_CORRECT=",
                   f"__ow_test() {{ printf '\\n%s %s 0\\n\\n%s\\n' {TOKEN}:begin \"$1\" {TOKEN}:end; }}"):
        outcomes, problem, _ = run_in_bash(prefix, body, tmp_path)
        assert not report(outcomes, problem).ok, prefix
        assert all(o.status != 0 for o in outcomes), (prefix, outcomes)


# -- through the kernel ------------------------------------------------------------------------

def test_the_magic_reports_and_fails_the_cell(module_kernel, module_workspace):
    kernel = module_kernel
    assert kernel.run("mkdir -p answers && echo 8 > answers/count.txt && top=apple").status == "ok"
    passed = kernel.run("%%check --points 1\nexpect_file answers/count.txt --contains 8\n[[ -d answers ]]")
    assert passed.status == "ok" and passed.text() == "✓ 2 checks passed (1 point)\n"
    assert passed.text("stderr") == ""
    failed = kernel.run("%%check --points 2\nexpect_var top banana  # the most common fruit is banana\n"
                        "expect_file answers/count.txt")
    assert failed.status == "error" and failed.text() == "✗ the most common fruit is banana\n"
    assert (failed.error["ename"], failed.error["evalue"]) == ("CheckFailed", "1 of 2 checks failed (0 of 2 points)")
    assert failed.text("stderr") == ""  # the check's words are its output, not a program's errors
    hinted = kernel.run("%%check --hint 'count the lines again'\nexpect_output 'cat answers/count.txt' 9")
    assert hinted.text() == "✗ count the lines again\n"
    assert kernel.run("echo $top $PWD").text() == f"apple {module_workspace}\n"  # the check changed nothing
    empty = kernel.run("%%check\n# nothing to check\n")
    assert empty.error["ename"] == "UsageError" and "has no test lines" in empty.error["evalue"]


def test_stop_and_the_time_limit_reach_a_check(module_kernel):
    kernel = module_kernel
    assert kernel.run("%timeout 1").status == "ok"
    slow = kernel.run("%%check\nsleep 30")
    assert slow.error["ename"] == "TimedOut"
    assert kernel.run("%timeout off").status == "ok"
    msg_id = kernel.send("%%check\nsleep 30")
    kernel.wait_for(lambda m: m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "status", 10,
                    "the check to start")
    time.sleep(0.5)  # the check's script is running
    kernel.km.interrupt_kernel()
    stopped = kernel.collect(msg_id)
    assert stopped.error["ename"] == "Interrupted" and stopped.seconds < 10
    assert kernel.run("echo still here").text() == "still here\n"
