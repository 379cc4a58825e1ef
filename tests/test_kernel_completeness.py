"""The local is_complete checker: bash structure, indents, invalid tokens, speed, and never crashing."""

from __future__ import annotations

import os
import random
import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from owsandbox.kernel.editing import completeness
from owsandbox.kernel.editing.completeness import check
from owsandbox.kernel.magics.framework import parse_cell

from .fuzz_budget import examples
from .steps import lines_run

STEPS_PER_CHARACTER = 64  # lines of the checker run per character of a cell, at most: one pass (about 8 to 26)

COMPLETE = [
    "",
    "   ",
    "\n\n",
    " \t\n ",
    "echo hi",
    "echo if done",
    "echo then fi esac do done } elif else in",
    "ls -la | grep x",
    "a && b || c",
    "sleep 1 &",
    "echo a; echo b;",
    "echo a # if a comment opens nothing",
    "# don't",
    "echo hi # it's \"fine\" (really",
    'echo \\"',
    "echo \\'",
    "echo $'it\\'s'",
    "echo 'a\"b' \"a'b\"",
    "echo $# ${#x} $$ $?",
    "echo a#b",
    "echo a\\\n",
    "# a comment does not go on \\",
    "echo a # nor here \\",
    "echo 'a\\'",
    "echo a \\\n  b",
    'echo "multi\nline" \'and\nmore\'',
    "echo `ls`",
    'echo "$(echo "nested \\"quotes\\" )")"',
    "echo ${x:-'}'}",
    "echo $[1+1]",
    "echo $() $( )",
    # if / loops
    "if true; then echo; fi",
    "if a; then b; elif c; then d; else e; fi",
    "if true\nthen\n    echo\nfi",
    "if (true) then echo; fi",
    "if ! true; then :; fi",
    "for x in a b; do echo $x; done",
    "for x; do :; done",
    "for x in a b\ndo\n    echo\ndone",
    "for x\nin a b; do :; done",
    "for ((i = 0; i < 3; i++)); do echo $i; done",
    "for ((;;)) do break; done",
    "for ((;;)) { break; }",
    "for x in a; { echo; }",
    "for do in done; do :; done",
    "select x in a b; do break; done",
    "while true; do break; done",
    "while (true) do :; done",
    "until false; do :; done",
    "while\n    false\ndo\n    :\ndone",
    # case
    "case x in a) echo;; b|c) echo;; *) ;; esac",
    "case x in (a) echo ;; esac",
    "case $x in\n    a)\n        echo a\n        ;;\nesac",
    "case x in a) echo ;& b) echo ;;& esac",
    "case x in *\\)*) echo;; esac",
    "case x in a) echo\nesac",
    "case x\nin\n    a) ;;\nesac",
    "case x in if) ;; done) ;; esac",
    "case x in esac",
    "$(case x in a) echo;; esac)",
    "echo $(case x in a) echo;; esac)",
    "x=$(if true; then echo; fi)",
    # arithmetic and conditionals
    "(( i++ ))",
    "((i = 1 + (2 * 3)))",
    "echo $(( (1 + 2) * 3 ))",
    "echo $((ls) | cat)",
    "((ls); echo)",
    '[[ $a == "(" ]]',
    "[[ -f x && ( -d y || -e z ) ]]",
    "[[ $x =~ ^(a|b)+$ ]]",
    "[[ a &&\n    b ]]",
    "[[ ! a ]] && [[ b ]] || (( 1 ))",
    # groups, subshells, functions
    "{ echo a; }",
    "{ echo a; echo b; } > /dev/null",
    "{ if true; then :; fi }",
    "{ (echo) }",
    "( cd / && ls )",
    "(ls) 2>&1",
    "{ ls; } 2>/dev/null",
    "{ ls; } {fd}>/dev/null",
    "f() { echo; }",
    "f() (ls)",
    "f ( ) { :; }",
    "f()\n{\n    :\n}",
    "f() [[ x ]]",
    "f() (( x ))",
    "function f { echo; }",
    "function f() { echo; }",
    "function f\n{\n    echo\n}",
    "function f (ls)",
    "f() {\n    if true; then\n        for i in 1 2; do\n            echo $i\n        done\n    fi\n}",
    # here-documents and here-strings
    "cat <<EOF\nhello\nEOF",
    "cat <<EOF\nif for case {\nEOF",
    "cat <<'EOF'\n$x \"unclosed\nEOF",
    'cat <<"EOF"\nx\nEOF',
    "cat << EOF\nx\nEOF",
    "cat <<E\\OF\nx\nEOF",
    "cat <<-EOF\n\tx\n\t\tEOF",
    "cat <<-'END' | tr a-z A-Z\n\tx\n\tEND",
    "cat <<EOF; echo after\nx\nEOF",
    "cat <<A <<B\na\nA\nb\nB",
    "cat <<EOF | while read l; do echo $l; done\nx\nEOF",
    "if true; then\n    cat <<EOF\nfi\nEOF\nfi",
    "x=$(cat <<EOF\nhello\nEOF\n)",
    "cat <<''\nx\n\n",
    "cat <<< if",
    "cat <<<'x'",
    # arrays and subscripts
    "a=(1 2 3)",
    "arr=(\n    a\n    # a comment )\n    \"b )\"\n)",
    "declare -a x=(1 2)",
    "local x=(a) y=(b)",
    "arr+=(x)",
    "a=(1 2) b",
    "a[1]=2",
    "a[$(echo 1)]=2 echo",
    "declare -A m=([k]=v [k2]=\"v 2\")",
    "echo a[",
    # the rest
    "! true",
    "time ls",
    "time;",
    "! ;",
    "coproc cat",
    "coproc NAME { cat; }",
    "cat <(ls) >(cat)",
    "while read l; do :; done < <(ls)",
    "echo @(a|b)",
    "trap 'echo bye' EXIT",
    "echo a > f 2>&1 &>/dev/null",
    "exec {fd}>/dev/null",
]

INCOMPLETE = [
    # quotes and expansions: no indent
    ("echo 'a", ""),
    ('echo "a', ""),
    ("echo $'a", ""),
    ("echo $'it\\'s", ""),
    ('echo "a\\"', ""),
    ("echo a#b'c", ""),
    ("echo `ls", ""),
    ("echo ${x", ""),
    ("echo $((1 +", ""),
    ("echo $[1+", ""),
    ("echo $(( a) b", ""),
    ("echo @(a|b", ""),
    ("echo 'it''s", ""),
    ("# don't\necho 'a", ""),
    ("a[x y", ""),
    ("(( i++", ""),
    ("for ((i = 0;", ""),
    # continuations
    ("echo \\", ""),
    ("echo a \\", ""),
    ("echo a\\\\\\", ""),
    ('echo "a\\', ""),
    # here-documents
    ("cat <<EOF", ""),
    ("cat <<EOF\nhello", ""),
    ("cat <<EOF\nhello\n", ""),
    ("cat <<'EOF'\nx\n EOF", ""),
    ("cat <<EOF\n\tEOF", ""),
    ("cat <<-EOF\n  EOF", ""),
    ('cat <<"EOF"\nEOF ', ""),
    ("cat <<A <<B\na\nA\nb", ""),
    ("cat <<<x <<EOF", ""),
    ("if true; then\n    cat <<EOF\nfi", ""),
    ("cat <<'EO", ""),
    # lines that go on
    ("echo a |", ""),
    ("echo a ||", ""),
    ("echo a &&", ""),
    ("echo a |&", ""),
    ("echo a |\n", ""),
    ("echo a &&\n\n", ""),
    ("f()", ""),
    ("f ( )\n", ""),
    ("function f", ""),
    ("function f()", ""),
    # open blocks: four spaces a level
    ("if true; then", "    "),
    ("if true", "    "),
    ("if true then fi", "    "),
    ("if true; then\n    echo", "    "),
    ("if true; then echo; else", "    "),
    ("if a; then b; elif c", "    "),
    ("for x in a; do", "    "),
    ("for x in a b", "    "),
    ("for x in a b\n", "    "),
    ("for x", "    "),
    ("while true", "    "),
    ("while true; do echo done", "    "),
    ("until false; do", "    "),
    ("select x in a; do", "    "),
    ("case x in", "    "),
    ("case x", "    "),
    ("case x in\n    a)", "        "),
    ("case x in a) echo;;", "    "),
    ("case x in a) echo esac", "        "),
    ("case x in a) echo", "        "),
    ("{", "    "),
    ("{ echo a }", "    "),
    ("(", "    "),
    ("( ls", "    "),
    ("f() {", "    "),
    ("function f {", "    "),
    ("f() (", "    "),
    ("[[", "    "),
    ("[[ a &&", "    "),
    ("{ if true; then :; fi", "    "),
    ("x=$(", "    "),
    ("echo $(ls", "    "),
    ("cat <(ls", "    "),
    ("arr=(", "    "),
    ("arr=(a\nb", "    "),
    ("x=$(if true; then", "        "),
    ("$(case x in a) echo;;", "        "),
    ("for x in a; do\n    if y; then", "        "),
    ("f() {\n    if x; then\n        for i in 1 2; do", "            "),
    ("if a; then\n    while b; do\n        case c in\n            x)", "                "),
    ("if a; then\n    f() {\n        echo |", "        "),
]

INVALID = [
    "fi",
    "done",
    "esac",
    "}",
    ")",
    "then",
    "do",
    "else",
    "elif x",
    "in",
    "]]",
    ";;",
    "echo a;;",
    ";",
    "echo a; ;",
    "& echo",
    "| grep",
    "echo a | ;",
    "echo a &;",
    "if ; then",
    "if true; fi",
    "if true; then fi fi",
    "if true; then :; fi fi",
    "if a; then b; else c; else d; fi",
    "if a; then b; else c; elif d; then e; fi",
    "while true; done",
    "while true; do :; done; done",
    "for x in a; done",
    "for x in a; echo",
    "for x y",
    "for x {",
    "for\nx in a; do :; done",
    "do echo; done",
    "{ echo; )",
    "( echo; }",
    "{ a |\n}",
    "$(fi)",
    "echo $(done)",
    "x=$(echo; })",
    "echo $(ls |)",
    "case x in a) if y; then echo;; esac",
    "case x in a b) ;; esac",
    "case x in a|\nb) ;; esac",
    "case x in a\n) ;; esac",
    "case x in a",
    "case x in ) ;; esac",
    "case x in a) ; esac",
    "case x in a) echo ;; esac esac",
    "case x; in",
    "echo >",
    "echo > ;",
    "echo >\nfile",
    "cat <<",
    "cat <<;",
    "f() echo",
    "function f echo",
    "f(\n) { :; }",
    "f(",
    "(ls) a",
    "{ ls; } x",
    "{ ls; } if",
    "{ echo; } }",
    "echo a (b)",
    "coproc",
    "coproc ;",
    "[[ a ; ]]",
    "[[ a\n]]",
    "[[ $x",
    "arr=(a;b)",
    "arr=(a | b)",
    "a=1 if true; then :; fi",
    "cat <<EOF >",
]


@pytest.mark.unit
@pytest.mark.parametrize("code", COMPLETE)
def test_complete(code: str) -> None:
    assert check(code) == ("complete", "")


@pytest.mark.unit
@pytest.mark.parametrize(("code", "indent"), INCOMPLETE)
def test_incomplete(code: str, indent: str) -> None:
    assert check(code) == ("incomplete", indent)


@pytest.mark.unit
@pytest.mark.parametrize("code", INVALID)
def test_invalid(code: str) -> None:
    assert check(code) == ("invalid", "")


@pytest.mark.unit
@pytest.mark.parametrize(("code", "expected"), [
    ("%read file", ("complete", "")),
    ("%read a b \\", ("incomplete", "")),
    ("%read a \\\nb", ("complete", "")),
    ("\n  %read 'unclosed", ("complete", "")),
    ("%read a\n%write b\n", ("complete", "")),
    # a cell magic's body is any text: it ends at a blank last line, never at its first line
    ("%%write path", ("incomplete", "")),
    ("%%shell other", ("incomplete", "")),
    ("%%send", ("incomplete", "")),
    ("%%write path\nif true; then\n'unclosed", ("incomplete", "")),
    ("%%write path\nif true; then\n'unclosed\n", ("complete", "")),
    ("%%write path\necho \\\n  ", ("complete", "")),
    ("%%write path\n", ("complete", "")),
    # shell code after line magics is bash again (magics.parse_cell runs it on the shell)
    ("%read x\necho hi", ("complete", "")),
    ("%read x\nif true; then", ("incomplete", "    ")),
    ("%read x\n\n%notmagic 'a", ("incomplete", "")),
    ("%read x\nfi", ("invalid", "")),
    ("echo 100%\nif", ("incomplete", "    ")),
])
def test_magics(code: str, expected: tuple[str, str]) -> None:
    assert check(code) == expected


@pytest.mark.unit
@pytest.mark.parametrize("code", ["%read x\nif true; then", "%a\n %b\nfor x in 1; do\n    echo", "\n%a\necho 'b"])
def test_magic_lines_are_split_from_shell_code_as_the_kernel_splits_them(code: str) -> None:
    parsed = parse_cell(code)
    assert parsed is not None and parsed.rest.strip()
    assert check(code) == check(parsed.rest)


SCRIPT = r'''#!/bin/bash
# a comment with a quote: don't
set -euo pipefail
name="world"; echo "hello, ${name:-nobody}!" 'single $x' $'ansi \' quote'
for f in *.txt "a b" $(ls /tmp | head -n 2); do
    if [[ -f "$f" && $f == *.txt ]]; then
        echo "file: $f" >> /tmp/out.log 2>&1
    elif [ -d "$f" ]; then
        echo dir
    else
        echo "other: $(basename "$f")"
    fi
done
while read -r line; do
    case "$line" in
        a|b) echo "a or b";;
        (c) echo c ;;
        *\)*) echo paren ;&
        "esac") echo literal ;;&
        *) ;;
    esac
done < <(printf '%s\n' a b c)
for ((i = 0; i < 3; i++)); do
    (( total += i ))
done
greet() {
    local who=${1:-you}
    local -a list=(one "two three" $'four')
    echo "hi $who ${#list[@]} ${list[0]}"
}
function nested() (
    cd /tmp && pwd
)
cat <<EOF
Heredoc with $name and $(date +%Y) and a fi done esac
EOF
cat <<-'END' | tr a-z A-Z
	tab indented, not expanded: $name
	END
x=$(
    echo one |
        tr o 0 &&
        echo two ||
        echo three
)
y=`echo back \`tick\``
arr=(
    first
    # a comment in an array )
    "second )"
)
declare -A map=([k]=v [k2]="v 2")
{ echo group; echo more; } > /dev/null
[[ $x =~ ^(a|b)+$ ]] && echo match
echo done if then fi \
    continued
echo "multi
line string"
if true
then
    echo spread
fi
case $x
in
    x)
        echo x
        ;;
esac
echo "$(if true; then echo "nested \"quotes\" )"; fi)"
echo ${x//\}/y} ${x#*\#} $((2#101)) $[1+1]
echo end
'''


@pytest.mark.unit
def test_typing_a_script_line_by_line_never_looks_invalid() -> None:
    lines = SCRIPT.split("\n")
    for k in range(1, len(lines) + 1):
        status, indent = check("\n".join(lines[:k]))
        assert status != "invalid", lines[k - 1]
        assert status == "incomplete" or indent == ""
    assert check(SCRIPT) == ("complete", "")


def _bash_says(code: str) -> str:
    env = {key: value for key, value in os.environ.items() if key != "BASH_ENV"}
    env["LC_ALL"] = "C"
    done = subprocess.run(["bash", "-n"], input=code.encode(), capture_output=True, env=env, timeout=30)
    err = done.stderr.decode(errors="replace")
    if "near unexpected token" in err:
        return "invalid"
    if "unexpected end of file" in err or "unexpected EOF" in err or "delimited by end-of-file" in err:
        return "incomplete"
    return "complete" if done.returncode == 0 and not err else "invalid"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_agrees_with_bash_on_every_line_prefix_of_a_script() -> None:
    """bash -n as the oracle (it differs on purpose only on a last line ending in a backslash)."""
    lines = SCRIPT.split("\n")
    disagreements = []
    for k in range(1, len(lines) + 1):
        code = "\n".join(lines[:k])
        ours, theirs = check(code)[0], _bash_says(code)
        if code.endswith("\\"):
            theirs = "incomplete"  # bash -n joins it to an empty line; a frontend waits for the next one
        if ours != theirs:
            disagreements.append((lines[k - 1], ours, theirs))
    assert disagreements == []


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_case_tables_agree_with_bash() -> None:
    """Each expected verdict is bash's own, apart from the deliberate differences listed here."""
    ours_by_design = {
        "echo a\\\\\\", "echo \\", "echo a \\",  # bash -n: a last backslash joins an empty line
        "[[", "[[ a &&",  # bash -n: EOF in `[[`, though a newline may come next
        "echo @(a|b", "echo @(a|b)",  # extglob off in bash -n
    }
    disagreements = []
    cases = [(code, "complete") for code in COMPLETE] + [(code, "incomplete") for code, _ in INCOMPLETE]
    cases += [(code, "invalid") for code in INVALID]
    for code, expected in cases:
        if code in ours_by_design or code.startswith("%") or not code.strip():
            continue
        if _bash_says(code) != expected:
            disagreements.append((code, expected))
    assert disagreements == []


@pytest.mark.unit
def test_ten_thousand_lines_are_decided_fast() -> None:
    """In one pass: a bounded number of the checker's lines per character (the seconds: benchmarks/cores_bench.py)."""
    code = "\n".join(f"echo line {i} | grep -v x > /dev/null; x=$((i + 1))" for i in range(10_000))
    assert check(code) == ("complete", "")
    assert lines_run(completeness, check, code) < STEPS_PER_CHARACTER * len(code)


@pytest.mark.unit
def test_a_typical_cell_takes_well_under_a_millisecond() -> None:
    """Counted in the checker's lines run, a few per character; its median time is in benchmarks/cores_bench.py."""
    code = "for f in *.txt; do\n    if [[ -f $f ]]; then\n        wc -l \"$f\"\n    fi\ndone"
    assert lines_run(completeness, check, code) < STEPS_PER_CHARACTER * len(code)


@pytest.mark.unit
@pytest.mark.parametrize("code", [
    "$( ((" * 5000, "$((" * 5000, "((" * 5000, "$(" * 20000, "{ " * 20000, "'" * 100001, "\\" * 100001,
    "a[" * 20000, "x@(a)" * 5000, "cat <<EOF\n" + "x\n" * 100_000 + "EOF",
])
def test_pathological_input_stays_linear(code: str) -> None:
    assert lines_run(completeness, check, code) < STEPS_PER_CHARACTER * len(code)


ALPHABET = list(" \t\n;&|()<>'\"`\\$#{}[]=!*?@+-%~01aAé\r\x00") + [
    "if ", "then ", "elif ", "else ", "fi", "for ", "in ", "do ", "done", "while ", "until ", "select ",
    "case ", "esac", "function ", "f() ", "coproc ", "time ", "! ", "{ ", "} ", "[[ ", " ]]", "((", "))",
    "$(", "${", "$((", "$'", "<<EOF", "<<-'E'", "EOF\n", "\tE\n", "<<<", "a=(", "a[", ";;", "2>&1", "<(",
]


def _assert_an_answer(code: str) -> None:
    status, indent = check(code)
    assert status in ("complete", "incomplete", "invalid"), code
    assert set(indent) <= {" "} and len(indent) % 4 == 0, code
    assert status == "incomplete" or indent == "", code


@pytest.mark.unit
@settings(max_examples=examples(3000), deadline=None, database=None)
@given(st.lists(st.sampled_from(ALPHABET), max_size=40).map("".join))
def test_never_raises_on_bashlike_input(code: str) -> None:
    _assert_an_answer(code)


@pytest.mark.unit
@settings(max_examples=examples(1000), deadline=None, database=None)
@given(st.text(max_size=80))
def test_never_raises_on_any_text(code: str) -> None:
    _assert_an_answer(code)


@pytest.mark.unit
def test_never_raises_on_many_random_strings() -> None:
    rng = random.Random(20240601)
    for _ in range(20_000):
        _assert_an_answer("".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 40))))
