"""`%%check`'s core, without I/O: a cell of shell tests becomes one bash script, and what the script
printed becomes a plain report.

A course checks an exercise where the student works: in the student's shell, with its folder,
variables and functions, without changing any of them. So the script is one subshell, and each test
line runs in a subshell of its own (a `cd` or an `exit` in a test changes nothing), its output thrown
away; the helpers (`expect_file`, `expect_output`, `expect_status`, `expect_var`) say on descriptor 3
what they found, and the script prints one report per test, framed by a token fresh for every check.

The verdict is the host's reading of that report, and it fails closed: a test passes only when its
own report says status 0, exactly once and in order, and the script said it reached its end. What a
student left in the shell cannot make a check pass by name: the script is parsed only after the
subshell has dropped every alias and the functions named like what the helpers use (in POSIX mode,
where `unset` cannot be a function), a read-only variable of the script's stops it (and so fails
it). The box runs the script, so a determined program in it could still forge a report; this is a
teaching aid, not a proctor.

A test is a line, or the lines that make one bash command (an `if … fi`, a continued line); a
comment at its end (`expect_var top banana  # the most common fruit`) is what a failure says.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from ..editing.completeness import INCOMPLETE, check

SEPARATOR = "\x1f"  # between the parts of a helper's finding
SHOWN_CHARS = 60  # of a value quoted in a sentence
FOUND_CHARS = 2000  # of a value a helper passes back
# What the helpers and the script use: a function of the student's by one of these names is dropped in
# the check's subshell (never in the student's shell).
USED_NAMES = ("unset", "unalias", "builtin", "command", "eval", "printf", "local", "declare", "read", "set",
              "return", "shift", "exit", "true", "false", "test", "[", "type", "echo", "shopt", "trap", "mapfile",
              "expect_file", "expect_output", "expect_status", "expect_var")

HELPERS = r"""
function __ow_found { local IFS=$'\x1f'; printf '%s' "$*" >&3; }
function expect_file {
    local path="" contains="" want=0
    while (( $# )); do
        case "$1" in
            --contains) (( $# >= 2 )) || { __ow_found usage "expect_file: --contains takes a text"; return 2; }
                        contains="$2"; want=1; shift 2 ;;
            *) [[ -z "$path" ]] || { __ow_found usage "expect_file takes one path, then --contains TEXT"; return 2; }
               path="$1"; shift ;;
        esac
    done
    [[ -n "$path" ]] || { __ow_found usage "expect_file takes a path: expect_file PATH [--contains TEXT]"; return 2; }
    if [[ ! -e "$path" ]]; then __ow_found missing "$path"; return 1; fi
    if [[ ! -f "$path" ]]; then __ow_found notfile "$path"; return 1; fi
    if (( want )); then
        local text
        text=$(< "$path")
        [[ "$text" == *"$contains"* ]] || { __ow_found lacks "$path" "$contains" "${text:0:2000}"; return 1; }
    fi
    return 0
}
function expect_output {
    local exact=1
    if [[ "$1" == --contains ]]; then exact=0; shift; fi
    if [[ "$3" == --contains ]]; then exact=0; fi
    (( $# >= 2 )) || { __ow_found usage "expect_output takes a command and a text: expect_output 'CMD' TEXT"
                       return 2; }
    local out
    out=$(eval "$1" 2>/dev/null </dev/null)
    if (( exact )); then [[ "$out" == "$2" ]] && return 0; else [[ "$out" == *"$2"* ]] && return 0; fi
    __ow_found output "$1" "${out:0:2000}" "$2" "$exact"
    return 1
}
function expect_status {
    (( $# == 2 )) || { __ow_found usage "expect_status takes a command and a number: expect_status 'CMD' N"; return 2; }
    local got
    ( eval "$1" ) >/dev/null 2>&1 </dev/null
    got=$?
    [[ "$got" == "$2" ]] && return 0
    __ow_found status "$1" "$got" "$2"
    return 1
}
function expect_var {
    (( $# == 2 )) || { __ow_found usage "expect_var takes a name and a value: expect_var NAME VALUE"; return 2; }
    if [[ ! -v "$1" ]]; then __ow_found unset "$1"; return 1; fi
    local got="${!1}"
    [[ "$got" == "$2" ]] && return 0
    __ow_found var "$1" "${got:0:2000}" "$2"
    return 1
}
function __ow_test {
    local found status
    found=$( ( eval "$2" ) 3>&1 >/dev/null 2>&1 </dev/null; printf '\x1e%s' "$?" )
    status="${found##*$'\x1e'}"
    found="${found%$'\x1e'*}"
    printf '\n%s %s %s\n%s\n%s\n' "$__ow_token:begin" "$1" "$status" "$found" "$__ow_token:end"
}
"""


@dataclass(frozen=True)
class Check:
    """One test of a `%%check` cell: its bash text, the cell line it starts on (1 for the first line of
    the body) and the comment at its end, if any (what a failure says instead of the test)."""

    number: int
    source: str
    line: int
    comment: str = ""


@dataclass
class Outcome:
    check: Check
    status: int | None  # None: no report came for it
    found: list[str] = field(default_factory=list)  # a helper's finding: kind, then its values


@dataclass
class CheckReport:
    lines: list[str]  # one sentence per failing test (a hint said once), or the one line of success
    passed: int
    failed: int
    summary: str  # the cell's error when a test failed

    @property
    def ok(self) -> bool:
        return self.failed == 0


def parse_checks(body: str) -> list[Check]:
    """The tests of a cell's body: blank and comment lines skipped, a command over several lines kept whole."""
    checks: list[Check] = []
    pending: list[str] = []
    start = 0
    for number, line in enumerate(body.split("\n"), start=1):
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if not pending:
            start = number
        pending.append(line)
        text = "\n".join(pending)
        if check(text)[0] != INCOMPLETE:
            checks.append(_made(len(checks), text, start))
            pending = []
    if pending:
        checks.append(_made(len(checks), "\n".join(pending), start))
    return checks


def _made(number: int, text: str, line: int) -> Check:
    code, comment = split_comment(text.rstrip())
    return Check(number, code.strip() or text.strip(), line, comment)


def split_comment(text: str) -> tuple[str, str]:
    """(the command, its last line's trailing comment): a `#` that starts a word outside quotes."""
    quote = ""
    escaped = False
    for index, char in enumerate(text):
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or text[index - 1] in " \t"):
            if "\n" in text[index:]:
                continue  # a comment on an earlier line of a longer test: bash's, kept in its text
            return text[:index].rstrip(), text[index + 1:].strip()
    return text, ""


def check_script(checks: list[Check], token: str) -> str:
    """The bash text that runs `checks` in a subshell of the current shell and reports each (see the
    module's docstring for why it is built this way)."""
    body = HELPERS + "".join(f"__ow_test {c.number} {shlex.quote(c.source)}\n" for c in checks)
    body += f"printf '\\n%s %s\\n' \"$__ow_token:done\" {len(checks)}\n"
    unset = " ".join(shlex.quote(name) for name in USED_NAMES)
    return (f"( __ow_token={token}; __ow_script={shlex.quote(body)}; POSIXLY_CORRECT=1 && [[ -o posix ]] && "
            f"\\unset -f {unset} && \\unalias -a && \\unset POSIXLY_CORRECT && \\eval \"$__ow_script\" ) 2>/dev/null")


_BEGIN = r"^{token}:begin (\d+) (\d+)\n(.*?)\n{token}:end$"


def read_outcomes(output: str, token: str, checks: list[Check]) -> tuple[list[Outcome], str | None]:
    """Each test's outcome from what the script printed, and what went wrong with the report itself
    (None when it is whole). Reports out of order, twice, or after the end count for nothing."""
    text = output.replace("\r\n", "\n")
    pattern = re.compile(_BEGIN.format(token=re.escape(token)), re.M | re.S)
    outcomes = [Outcome(c, None) for c in checks]
    seen: dict[int, int] = {}
    problem: str | None = None
    expected = 0
    for found in pattern.finditer(text):
        number, status = int(found.group(1)), int(found.group(2))
        seen[number] = seen.get(number, 0) + 1
        if number != expected or number >= len(checks):
            problem = "the check's report came out of order"
            continue
        expected += 1
        outcomes[number].status = status
        outcomes[number].found = found.group(3).split(SEPARATOR) if found.group(3) else []
    twice = [n for n, count in seen.items() if count > 1]
    if twice:
        for number in twice:
            if number < len(outcomes):
                outcomes[number].status = None
        problem = "a test was reported twice (something in the shell wrote a report of its own)"
    done = re.search(rf"^{re.escape(token)}:done (\d+)$", text, re.M)
    if done is None or int(done.group(1)) != len(checks):
        problem = problem or ("the check did not run to its end: a read-only variable of the check's, a shell in "
                              "POSIX mode, or a test that ended the check's own shell")
        for outcome in outcomes[expected:]:
            outcome.status = None
    return outcomes, problem


def shown(value: str) -> str:
    """A value in a sentence: quoted, line breaks as \\n, shortened."""
    value = value.replace("\n", "\\n")
    if len(value) > SHOWN_CHARS:
        value = value[:SHOWN_CHARS] + "…"
    return f"'{value}'"


def finding(found: list[str]) -> str:
    """What a helper found, in words (empty for a plain test line)."""
    if not found:
        return ""
    kind, values = found[0], found[1:] + ["", "", "", ""]
    if kind == "missing":
        return f"{values[0]} does not exist"
    if kind == "notfile":
        return f"{values[0]} is not a file"
    if kind == "lacks":
        return f"{values[0]} does not contain {shown(values[1])} (it holds {shown(values[2])})"
    if kind == "output":
        wanted = "" if values[3] == "1" else "something with "
        return f"it printed {shown(values[1])}, not {wanted}{shown(values[2])}"
    if kind == "status":
        return f"it exited with status {values[1]}, not {values[2]}"
    if kind == "unset":
        return f"${values[0]} is not set"
    if kind == "var":
        return f"${values[0]} is {shown(values[1])}, not {shown(values[2])}"
    if kind == "usage":
        return values[0]
    return " ".join(found)


def sentence(outcome: Outcome, hint: str = "") -> str:
    """The one plain line a failing test prints: its comment, else the cell's hint, else the test and what
    was found (or its status)."""
    said = outcome.check.comment or hint
    if said:
        return f"✗ {said}"
    test = outcome.check.source.replace("\n", " ⏎ ")
    if outcome.status is None:
        return f"✗ {test}: not run to its end"
    found = finding(outcome.found)
    return f"✗ {test}: {found}" if found else f"✗ {test} (exit status {outcome.status})"


def report(outcomes: list[Outcome], problem: str | None = None, hint: str = "",
           points: float | None = None) -> CheckReport:
    failing = [o for o in outcomes if o.status != 0]
    worth = "" if points is None else f" ({points:g} point{'' if points == 1 else 's'})"
    count = len(outcomes)
    if not failing and problem is None:
        return CheckReport([f"✓ {count} check{'' if count == 1 else 's'} passed{worth}"], count, 0, "")
    lines = list(dict.fromkeys(sentence(o, hint) for o in failing))
    if problem is not None:
        lines.append(f"✗ {problem}")
    earned = "" if points is None else f" (0 of {points:g} point{'' if points == 1 else 's'})"
    summary = f"{len(failing) or 1} of {count} check{'' if count == 1 else 's'} failed{earned}"
    return CheckReport(lines, count - len(failing), len(failing) or 1, summary)
