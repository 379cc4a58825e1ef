"""Is a bash cell finished? The answer to Jupyter's `is_complete_request`, decided locally.

Jupyter console asks after every Enter whether the text typed so far is a whole cell. It waits at
most a second for the answer; after a timeout it stops asking for the rest of the session and falls
back to guessing. So the answer cannot come from the sandbox (`bash -n` there costs a round trip
and a process): it comes from this small hand-written lexer and parser of bash's structure, pure
Python, no I/O, in one pass over the text (milliseconds for thousands of lines).

It knows what decides completeness: quotes and expansions (`'`, `"`, `$'`, backticks, `$(`, `${`,
`$((`, `<(`, `arr=(`), backslash continuations, here-documents, compound commands (`if`, loops,
`case`, `{`, `(`, `[[`, `((`, functions) with their reserved words recognised only where bash
recognises them, and lines ending in `|`, `&&`, `||`. "invalid" means bash would reject the text
however it goes on: a token nothing open can take (`fi` with no `if`, `;;` outside a `case`), or a
newline where the last line ends (`echo >`). Errors it does not look for, such as an empty `{ }`,
pass as complete: the cell runs and bash reports them.

The indent is four spaces per open block (a `case` branch counts two); inside a quote, a
here-document or after a backslash it is "", since spaces there would change the text.
"""

from __future__ import annotations

import re

from ..magics.framework import parse_cell

COMPLETE = "complete"
INCOMPLETE = "incomplete"
INVALID = "invalid"
INDENT = "    "


def check(code: str) -> tuple[str, str]:
    """("complete", "") | ("incomplete", indent) | ("invalid", "")"""
    if not code.strip():
        return COMPLETE, ""
    head = code.lstrip("\n\r\t ")
    if head.startswith("%"):
        return _check_magics(head)
    return _check_bash(code)


def line_starts(code: str) -> list[int]:
    """Where lines of `code` start at its own level, read as bash reads them: not inside a quote, a
    here-document, a substitution or after a backslash. A magic spelled there would go to bash as a
    command (the kernel refuses a cell magic below the first line: `placement.py`). The starts found
    before text bash would reject, or that is unfinished, are those lines all the same."""
    scanner = _Scanner(code)
    scanner.line_starts = [0]
    try:
        scanner.run()
    except (_Invalid, _Unfinished):
        pass
    return scanner.line_starts


def _check_magics(head: str) -> tuple[str, str]:
    """Magics, read as the kernel reads them (`magics.parse_cell`).

    A `%%` cell magic takes any text as its body, so only the writer knows where it ends: as in
    IPython, the cell is complete once its last line is blank (Enter on an empty line in a console),
    never on its first line (`%%write PATH` alone would write an empty file). `%` lines at the top are
    line magics, one line each, and what follows them is shell code; with none, the cell goes on only
    after a last line ending in a backslash.
    """
    parsed = parse_cell(head)
    assert parsed is not None  # `head` starts with a %
    last_line = head.rpartition("\n")[2]
    if parsed.cell is not None:
        return (COMPLETE, "") if "\n" in head and not last_line.strip() else (INCOMPLETE, "")
    if parsed.rest.strip():
        return _check_bash(parsed.rest)
    return (INCOMPLETE, "") if last_line.endswith("\\") else (COMPLETE, "")


def _check_bash(code: str) -> tuple[str, str]:
    try:
        return _Scanner(code).run()
    except _Invalid:
        return INVALID, ""
    except _Unfinished:
        return INCOMPLETE, ""


class _Invalid(Exception):
    """A token that nothing open can accept."""


class _Unfinished(Exception):
    """Inside a quote, a here-document or a continuation: more text is needed, and no indent."""


# Command contexts: text parsed as commands. Each has its own stack of open compound commands.
TOP, CMDSUB, PROCSUB, ARRAY = "top", "$(", "<(", "=("

# Lexical frames: text inside a word.
SQUOTE, ANSIC, DQUOTE, BACKTICK, PARAM, ARITH, EXTGLOB, PARENS = "'", "$'", '"', "`", "${", "((", "@(", "$( ("
SUBSCRIPT = "["  # `name[...]` where an assignment may be: bash matches the bracket, across lines too
OLD_ARITH = "$["  # `$[...]`, the old spelling of `$((...))`

# Open compound commands (a context's blocks).
IF_COND, IF_THEN, IF_ELSE = "if", "then", "else"
LOOP_HEAD, LOOP_BODY = "loop", "do"
CASE_HEAD, CASE_BODY = "case", "case)"
GROUP, SUBSHELL, COND = "{", "(", "[["

# What a context expects next.
CMD = "cmd"  # the start of a command: reserved words count here
ARGS = "args"  # inside a simple command
AFTER = "after"  # after a compound command: reserved words count, a new command may not start
REDIR = "redir"  # the target of a redirection
IN_COND = "in[["  # between `[[` and `]]`
FOR_NAME, FOR_IN, FOR_WORDS, FOR_ARITH, PRE_DO = "for", "for-in", "for-words", "for-((", "pre-do"
CASE_WORD, CASE_IN, CASE_PAT, CASE_PAT_WORD, CASE_PAT_MORE = "case", "case-in", "pat", "pat-word", "pat-more"
FUNC_NAME, FUNC_AFTER_NAME, FUNC_PAREN, FUNC_BODY = "function", "function-name", "f(", "f()"
COPROC, COPROC_NAME = "coproc", "coproc-name"

_SIMPLE_STATES = frozenset({CMD, ARGS, AFTER, COPROC, COPROC_NAME})
_RESERVED = frozenset(
    "if then elif else fi for while until select do done case esac in function { } ! time [[ ]] coproc".split()
)
_OPENERS = frozenset("if for while until select case function { ! time [[ coproc".split())
_COMPOUND_STARTS = frozenset("if for while until select case { [[".split())

_BLANKS = re.compile(r"[ \t]+")
_PLAIN = re.compile(r"[^ \t\n;&|()<>'\"`\\$]+")
_DELIM_PLAIN = re.compile(r"[^ \t\n;&|()<>'\"\\]+")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\[[^\]]*\])?\+?=")
_SUBSCRIPT_START = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\[")
_DECLARATIONS = frozenset("declare typeset local export readonly".split())
_IO_NUMBER = re.compile(r"[0-9]+|\{[A-Za-z_][A-Za-z0-9_]*\}")
_STOPS = {
    ANSIC: re.compile(r"[\\']"),
    DQUOTE: re.compile(r"[\\\"$`]"),
    BACKTICK: re.compile(r"[\\`]"),
    PARAM: re.compile(r"[\\'\"$`{}]"),
    ARITH: re.compile(r"[\\'\"$`()]"),
    EXTGLOB: re.compile(r"[\\'\"$`()]"),
    PARENS: re.compile(r"[\\'\"$`()]"),
    SUBSCRIPT: re.compile(r"[\\'\"$`\[\]]"),
    OLD_ARITH: re.compile(r"[\\'\"$`\[\]]"),
}
_ARITH_SCAN = re.compile(r"[()'\"\\]")
_WORD = re.compile(r"[^ \t\n;&|()<>'\"`\\$#][^ \t\n;&|()<>'\"`\\$]*(?=[ \t\n;&|)]|\Z)")
_OPERATOR = re.compile(r";;&|;;|;&|;|&&|&>>|&>|&|\|\||\|&|\||<<<|<<-|<<|<&|<>|<|>>|>&|>\||>|\(|\)")
_SEPARATORS = frozenset({";", "&"})
_CASE_ENDS = frozenset({";;", ";&", ";;&"})
_CONNECTORS = frozenset({"|", "|&", "&&", "||"})
_OPERATOR_CHARS = frozenset(";&|<>()")
_COND_OPERATORS = frozenset({"&&", "||", "(", ")", "<", ">", "|"})  # `|` for `=~ a|b`


class _Context:
    """Text read as commands: the cell, `$(...)`, `<(...)`, `>(...)` or the words of `name=(...)`."""

    __slots__ = ("kind", "blocks", "state", "need_cmd", "empty", "words", "arrays", "declaring", "after_redir",
                 "cond_nl_ok", "in_word", "plain", "buf", "last")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.blocks: list[str] = []
        self.state = CMD
        self.need_cmd = False  # after `|`, `&&`, `||`: a command must follow, newlines may come first
        self.empty = True  # nothing of the current command yet: `;` here is an error
        self.words = 0  # words in the current simple command
        self.arrays = True  # `name=(` opens an array here: only assignments so far, or after `declare`
        self.declaring = False  # the command is `declare`, `local`, `export`, ...
        self.after_redir = ARGS
        self.cond_nl_ok = False  # in `[[ ]]`, whether a newline may come next
        self.in_word = False
        self.plain = True  # the word so far is unquoted literal text (so it may be a reserved word)
        self.buf: list[str] = []
        self.last = ""  # the word's last unquoted literal character, for `@(`-style patterns


class _Lexical:
    """A quote, `${...}`, `$((...))`, `((...))`, a subscript or a pattern's `@(...)`: inside a word."""

    __slots__ = ("kind", "depth", "then", "start")

    def __init__(self, kind: str, then: str = "", start: int = 0) -> None:
        self.kind = kind
        self.depth = 0
        self.then = then  # for `((`: what the context expects once it closes
        self.start = start  # for a subscript: where its text starts


class _Scanner:
    def __init__(self, code: str) -> None:
        self.code = code
        self.n = len(code)
        self.pos = 0
        self.frames: list[_Context | _Lexical] = [_Context(TOP)]
        self.heredocs: list[tuple[str, bool]] = []
        self.paren_matches: dict[int, int] = {}  # `(` position -> its `)` (-1: none), for `((`
        self.line_starts: list[int] | None = None  # where lines start at the top level, when asked (line_starts)

    def run(self) -> tuple[str, str]:
        frames = self.frames
        while self.pos < self.n:
            top = frames[-1]
            if isinstance(top, _Context):
                self._scan_context(top)
            else:
                self._step_lexical(top)
        return self._at_end()

    # ----- the end of the text

    def _at_end(self) -> tuple[str, str]:
        top = self.frames[-1]
        if not isinstance(top, _Context):
            raise _Unfinished
        self._end_word(top)
        self._newline(top)  # the frontend's next character: where bash rejects a newline, say so now
        if self.heredocs:
            raise _Unfinished
        if len(self.frames) > 1 or top.blocks or top.need_cmd or top.state not in _SIMPLE_STATES:
            return INCOMPLETE, INDENT * self._levels()
        return COMPLETE, ""

    def _levels(self) -> int:
        levels = 0
        for frame in self.frames:
            if isinstance(frame, _Context):
                levels += (frame.kind != TOP) + len(frame.blocks) + frame.blocks.count(CASE_BODY)
        return levels

    # ----- command contexts

    def _scan_context(self, ctx: _Context) -> None:
        """Read commands until the text ends, or another frame opens, or this one closes."""
        code, n, frames = self.code, self.n, self.frames
        while self.pos < n and frames[-1] is ctx:
            pos = self.pos
            c = code[pos]
            if c == " " or c == "\t":
                if ctx.in_word:
                    self._end_word(ctx)
                pos = self.pos = _BLANKS.match(code, pos).end()
                if pos >= n:
                    break
                c = code[pos]
            if c == "\n":
                if ctx.in_word:
                    self._end_word(ctx)
                self.pos = pos + 1
                self._newline(ctx)
                if self.heredocs:
                    self._read_heredocs()
                if self.line_starts is not None and len(frames) == 1:
                    self.line_starts.append(self.pos)
            elif c == "#" and not ctx.in_word:
                end = code.find("\n", pos)
                self.pos = n if end < 0 else end
            elif c in _OPERATOR_CHARS:
                self._operator(ctx, c)
            elif not ctx.in_word and (word := self._whole_word(ctx, pos)):
                self.pos = pos + len(word)
                self._finish_word(ctx, word, word)
            else:
                self._word_part(ctx, c)

    def _whole_word(self, ctx: _Context, pos: int) -> str:
        """The fast path: an unquoted word with nothing special in it, or ""."""
        match = _WORD.match(self.code, pos)
        if match is None:
            return ""
        word = match.group()
        if "[" in word and self._subscript_cut(ctx, word) >= 0:
            return ""
        return word

    def _word_part(self, ctx: _Context, c: str) -> None:
        code, pos = self.code, self.pos
        if c == "\\":
            if pos + 1 >= self.n:
                raise _Unfinished  # a continuation on the last line
            self.pos = pos + 2
            if code[pos + 1] != "\n":
                self._begin_word(ctx, plain=False)
            return
        if c in "'\"`":
            self._begin_word(ctx, plain=False)
            self.frames.append(_Lexical(c))
            self.pos = pos + 1
        elif c == "$":
            self._begin_word(ctx, plain=False)
            self._dollar(quotes=True)
        else:
            match = _PLAIN.match(code, pos)
            text = match.group() if match else c
            cut = self._subscript_cut(ctx, text) if "[" in text else -1
            if cut >= 0:
                text = text[:cut]
                self.frames.append(_Lexical(SUBSCRIPT, start=pos + cut))
            self._begin_word(ctx, plain=True)
            ctx.buf.append(text)
            ctx.last = text[-1:]
            self.pos = pos + len(text)

    @staticmethod
    def _subscript_cut(ctx: _Context, text: str) -> int:
        """Where `name[` in an assignment's place (or `[` opening a word in `arr=(...)`) ends, else -1."""
        if ctx.kind == ARRAY:
            return 1 if text[0] == "[" and not ctx.in_word else -1
        if not (ctx.arrays and not ctx.declaring and ctx.plain and ctx.state in (CMD, ARGS)):
            return -1
        before = "".join(ctx.buf) if ctx.in_word else ""
        match = _SUBSCRIPT_START.match(before + text)
        if match is None or match.end() <= len(before):
            return -1
        return match.end() - len(before)

    @staticmethod
    def _begin_word(ctx: _Context, plain: bool) -> None:
        ctx.in_word = True
        ctx.last = ""
        if not plain:
            ctx.plain = False

    def _end_word(self, ctx: _Context) -> None:
        if not ctx.in_word:
            return
        literal = "".join(ctx.buf)
        text = literal if ctx.plain else None
        ctx.in_word, ctx.plain, ctx.buf, ctx.last = False, True, [], ""
        self._finish_word(ctx, literal, text)

    def _finish_word(self, ctx: _Context, literal: str, text: str | None) -> None:
        self._word(ctx, text)
        if ctx.state == ARGS and ctx.arrays and not ctx.declaring:
            ctx.arrays = _ASSIGNMENT.match(literal) is not None

    def _dollar(self, quotes: bool) -> None:
        """At a `$`: open what it starts (`$'` and `$"` only where quotes are quotes)."""
        code, pos = self.code, self.pos
        nxt = code[pos + 1] if pos + 1 < self.n else ""
        if nxt == "(":
            if code.startswith("(", pos + 2):
                self.frames.append(_Lexical(ARITH))  # may turn out to be `$( (...) ...)`: see _bracket
                self.pos += 1
            else:
                self.frames.append(_Context(CMDSUB))
            self.pos += 2
        elif nxt == "{" or nxt == "[":
            self.frames.append(_Lexical(PARAM if nxt == "{" else OLD_ARITH))
            self.pos = pos + 2
        elif quotes and nxt in ("'", '"'):
            self.frames.append(_Lexical(ANSIC if nxt == "'" else DQUOTE))
            self.pos = pos + 2
        else:
            self.pos = pos + 1

    def _is_arithmetic(self, start: int) -> bool:
        """After the `((` of a command: arithmetic if the matching close is `))`, else nested subshells.

        Like bash, match the parentheses by counting (skipping quotes). One scan records the match of
        every `(` it passes, so nested `((` cost nothing more and the whole check stays linear.
        """
        opening = start - 1
        if opening not in self.paren_matches:
            self._match_parens(opening)
        close = self.paren_matches[opening]
        return close < 0 or self.code.startswith(")", close + 1)

    def _match_parens(self, opening: int) -> None:
        code, matches = self.code, self.paren_matches
        stack, i = [opening], opening + 1
        while stack:
            match = _ARITH_SCAN.search(code, i)
            if match is None:
                break
            c, i = match.group(), match.end()
            if c == "(":
                stack.append(i - 1)
            elif c == ")":
                matches[stack.pop()] = i - 1
            elif c == "\\":
                i += 1
            else:
                close = code.find(c, i)
                if close < 0:
                    break
                i = close + 1
        for unmatched in stack:
            matches[unmatched] = -1

    def _operator(self, ctx: _Context, c: str) -> None:
        code, pos = self.code, self.pos
        nxt = code[pos + 1] if pos + 1 < self.n else ""
        if c == "(" and ctx.in_word and self._paren_in_word(ctx):
            return
        if c in "<>" and nxt == "(" and ctx.state != IN_COND:
            self._begin_word(ctx, plain=False)  # process substitution, part of a word
            self.frames.append(_Context(PROCSUB))
            self.pos = pos + 2
            return
        if c in "<>" and ctx.in_word and ctx.plain and _IO_NUMBER.fullmatch("".join(ctx.buf)):
            ctx.in_word, ctx.buf, ctx.last = False, [], ""  # `2>`, `{fd}>`: part of the redirection
        else:
            self._end_word(ctx)
        op = _OPERATOR.match(code, pos).group()
        self.pos = pos + len(op)
        self._op(ctx, op)

    def _paren_in_word(self, ctx: _Context) -> bool:
        """`name=(` opens an array; `@(`, `!(`, `*(`, `+(`, `?(` open an extended pattern."""
        if ctx.arrays and ctx.plain and ctx.state in (CMD, ARGS) and _ASSIGNMENT.fullmatch("".join(ctx.buf)):
            self.frames.append(_Context(ARRAY))
        elif ctx.last and ctx.last in "?*+@!":
            self.frames.append(_Lexical(EXTGLOB))
        else:
            return False
        self._begin_word(ctx, plain=False)
        self.pos += 1
        return True

    # ----- the grammar: words

    def _word(self, ctx: _Context, text: str | None) -> None:
        """A whole word; `text` is None when quoting or expansions make it no reserved word."""
        state = ctx.state
        if ctx.kind == ARRAY:
            return
        if state == CMD or state == AFTER:
            if text in _RESERVED:
                self._reserved(ctx, text)
            elif state == AFTER:
                raise _Invalid  # `(ls) a`, `fi x`
            else:
                ctx.state, ctx.words, ctx.need_cmd, ctx.empty = ARGS, 1, False, False
                ctx.declaring = text in _DECLARATIONS
        elif state == ARGS:
            ctx.words += 1
        elif state == REDIR:
            ctx.state = ctx.after_redir
        elif state == IN_COND:
            if text == "]]":
                ctx.blocks.pop()
                ctx.state = AFTER
            else:
                ctx.cond_nl_ok = text == "!"
        elif state in (COPROC, COPROC_NAME):
            self._coproc_word(ctx, text)
        elif state in (FOR_NAME, FOR_IN, FOR_WORDS, FOR_ARITH, PRE_DO):
            self._for_word(ctx, text)
        elif state in (CASE_WORD, CASE_IN, CASE_PAT, CASE_PAT_WORD, CASE_PAT_MORE):
            self._case_word(ctx, text)
        elif state == FUNC_NAME:
            ctx.state = FUNC_AFTER_NAME
        elif state in (FUNC_AFTER_NAME, FUNC_BODY) and text in _COMPOUND_STARTS:
            ctx.state = CMD
            self._open(ctx, text)
        else:  # `f() echo`: a body must be a compound command; `f(` wants `)`
            raise _Invalid

    def _reserved(self, ctx: _Context, word: str) -> None:
        if word in _OPENERS:
            if ctx.state == AFTER:
                raise _Invalid  # e.g. `fi if`: a command cannot start here
            self._open(ctx, word)
        elif ctx.need_cmd or word in ("in", "]]"):
            raise _Invalid
        else:
            self._close(ctx, word)

    def _open(self, ctx: _Context, word: str) -> None:
        ctx.need_cmd = False
        if word in ("!", "time"):
            ctx.empty = False  # `! ;` and `time;` are accepted by bash
        elif word == "function":
            ctx.state = FUNC_NAME
        elif word == "coproc":
            ctx.state = COPROC
        elif word == "[[":
            ctx.blocks.append(COND)
            ctx.state, ctx.cond_nl_ok = IN_COND, True
        elif word in ("for", "select"):
            ctx.blocks.append(LOOP_HEAD)
            ctx.state = FOR_NAME
        elif word == "case":
            ctx.blocks.append(CASE_HEAD)
            ctx.state = CASE_WORD
        else:
            ctx.blocks.append({"if": IF_COND, "{": GROUP}.get(word, LOOP_HEAD))
            self._command_start(ctx)

    def _close(self, ctx: _Context, word: str) -> None:
        """then, elif, else, fi, do, done, esac, `}`: each valid only on top of its opener."""
        top = ctx.blocks[-1] if ctx.blocks else None
        moves = {
            "then": (IF_COND, IF_THEN), "elif": (IF_THEN, IF_COND), "else": (IF_THEN, IF_ELSE),
            "do": (LOOP_HEAD, LOOP_BODY),
        }
        if word in moves:
            before, after = moves[word]
            if top != before:
                raise _Invalid
            ctx.blocks[-1] = after
            self._command_start(ctx)
            return
        openers = {"fi": (IF_THEN, IF_ELSE), "done": (LOOP_BODY,), "esac": (CASE_BODY,), "}": (GROUP,)}
        if top not in openers[word]:
            raise _Invalid
        ctx.blocks.pop()
        ctx.state = AFTER

    @staticmethod
    def _command_start(ctx: _Context) -> None:
        ctx.state, ctx.empty, ctx.words, ctx.arrays, ctx.declaring = CMD, True, 0, True, False

    def _coproc_word(self, ctx: _Context, text: str | None) -> None:
        """`coproc cmd args`, `coproc { ...; }` or `coproc NAME { ...; }`."""
        if text in _COMPOUND_STARTS:
            ctx.state = CMD
            self._open(ctx, text)
        elif ctx.state == COPROC:
            ctx.state, ctx.words, ctx.empty = COPROC_NAME, 1, False
        else:
            ctx.state, ctx.words = ARGS, 2

    def _for_word(self, ctx: _Context, text: str | None) -> None:
        state = ctx.state
        if state == FOR_NAME:
            ctx.state = FOR_IN
        elif state == FOR_WORDS:
            return
        elif text == "in" and state == FOR_IN:
            ctx.state = FOR_WORDS
        elif text == "do":
            ctx.blocks[-1] = LOOP_BODY
            self._command_start(ctx)
        elif text == "{" and state in (PRE_DO, FOR_ARITH):  # `for x in a; { ...; }`
            ctx.blocks[-1] = GROUP
            self._command_start(ctx)
        else:
            raise _Invalid

    def _case_word(self, ctx: _Context, text: str | None) -> None:
        state = ctx.state
        if state == CASE_WORD:
            ctx.state = CASE_IN
        elif state == CASE_IN:
            if text != "in":
                raise _Invalid
            ctx.state = CASE_PAT
        elif state == CASE_PAT and text == "esac":
            ctx.blocks.pop()
            ctx.state = AFTER
        elif state in (CASE_PAT, CASE_PAT_WORD):
            ctx.state = CASE_PAT_MORE
        else:  # two words in one pattern
            raise _Invalid

    # ----- the grammar: operators and newlines

    def _op(self, ctx: _Context, op: str) -> None:
        state = ctx.state
        if ctx.kind == ARRAY:
            if op != ")":
                raise _Invalid
            self.frames.pop()
        elif state in _SIMPLE_STATES:
            self._command_op(ctx, op)
        elif state == IN_COND:
            if op not in _COND_OPERATORS:
                raise _Invalid
            ctx.cond_nl_ok = op in ("&&", "||", "(")
        elif state in (CASE_PAT, CASE_PAT_WORD, CASE_PAT_MORE):
            self._case_op(ctx, op)
        elif state == FOR_NAME and op == "(" and self._arithmetic_command(ctx, then=FOR_ARITH):
            return
        elif op == ";" and state in (FOR_IN, FOR_WORDS, FOR_ARITH):
            ctx.state = PRE_DO
        elif op == "(" and state == FUNC_AFTER_NAME and self._next_nonblank() == ")":
            ctx.state = FUNC_PAREN
        elif op == "(" and state in (FUNC_AFTER_NAME, FUNC_BODY):
            ctx.state = CMD  # `f() (ls)`, `function f (ls)`
            self._open_paren(ctx)
        elif op == ")" and state == FUNC_PAREN:
            ctx.state = FUNC_BODY
        else:  # REDIR without its target, `for x y`, `case x;`, `function ;`, ...
            raise _Invalid

    def _next_nonblank(self) -> str:
        match = _BLANKS.match(self.code, self.pos)
        i = match.end() if match else self.pos
        return self.code[i:i + 1]

    def _command_op(self, ctx: _Context, op: str) -> None:
        state = ctx.state
        if op in _SEPARATORS or op in _CONNECTORS:
            if (state == CMD and (ctx.empty or ctx.need_cmd)) or state == COPROC:
                raise _Invalid
            self._command_start(ctx)
            ctx.need_cmd = op in _CONNECTORS
        elif op in _CASE_ENDS:
            if ctx.need_cmd or not ctx.blocks or ctx.blocks[-1] != CASE_BODY:
                raise _Invalid
            ctx.blocks[-1] = CASE_HEAD
            ctx.state = CASE_PAT
        elif op == "(":
            self._open_paren(ctx)
        elif op == ")":
            self._close_paren(ctx)
        else:
            self._redirection(ctx, op)

    def _open_paren(self, ctx: _Context) -> None:
        state = ctx.state
        if state in (CMD, COPROC, COPROC_NAME):
            ctx.need_cmd = False
            if not self._arithmetic_command(ctx, then=AFTER):
                ctx.blocks.append(SUBSHELL)
                self._command_start(ctx)
        elif state == ARGS and ctx.words == 1:
            ctx.state = FUNC_PAREN  # `name (`
        else:
            raise _Invalid

    def _arithmetic_command(self, ctx: _Context, then: str) -> bool:
        """At `((` of `(( expr ))` or `for ((;;))`: open it and say so."""
        if not (self.code.startswith("(", self.pos) and self._is_arithmetic(self.pos + 1)):
            return False
        self.frames.append(_Lexical(ARITH, then=then))
        self.pos += 1
        ctx.empty = False
        return True

    def _close_paren(self, ctx: _Context) -> None:
        if ctx.need_cmd:
            raise _Invalid
        if ctx.blocks:
            if ctx.blocks[-1] != SUBSHELL:
                raise _Invalid
            ctx.blocks.pop()
            ctx.state = AFTER
        elif ctx.kind in (CMDSUB, PROCSUB):
            self.frames.pop()
        else:
            raise _Invalid

    def _case_op(self, ctx: _Context, op: str) -> None:
        state = ctx.state
        if op == "(" and state == CASE_PAT:
            ctx.state = CASE_PAT_WORD
        elif op == "|" and state == CASE_PAT_MORE:
            ctx.state = CASE_PAT_WORD
        elif op == ")" and state == CASE_PAT_MORE:
            ctx.blocks[-1] = CASE_BODY
            self._command_start(ctx)
        else:
            raise _Invalid

    def _redirection(self, ctx: _Context, op: str) -> None:
        if ctx.state == AFTER:
            ctx.after_redir = AFTER
        else:
            ctx.after_redir = ARGS
            ctx.need_cmd = ctx.empty = False
        if op in ("<<", "<<-"):
            self._heredoc_delimiter(strip_tabs=op == "<<-")
            ctx.state = ctx.after_redir
        else:
            ctx.state = REDIR

    def _newline(self, ctx: _Context) -> None:
        state = ctx.state
        if ctx.kind == ARRAY or state in (FOR_IN, PRE_DO, CASE_IN, CASE_PAT, FUNC_AFTER_NAME, FUNC_BODY):
            return
        if state in _SIMPLE_STATES and state != COPROC:
            if not ctx.need_cmd:
                self._command_start(ctx)
        elif state in (FOR_WORDS, FOR_ARITH):
            ctx.state = PRE_DO
        elif state != IN_COND or not ctx.cond_nl_ok:
            raise _Invalid  # a redirection's target, `for`, `case`, `function`, `coproc`, `f(`, in a pattern

    # ----- here-documents

    def _heredoc_delimiter(self, strip_tabs: bool) -> None:
        """After `<<` or `<<-`: read the word whose unquoted text ends the document."""
        code, n = self.code, self.n
        match = _BLANKS.match(code, self.pos)
        i = match.end() if match else self.pos
        parts: list[str] = []
        quoted = False
        while i < n and code[i] not in " \t\n;&|()<>":
            c = code[i]
            if c == "'":
                close = code.find("'", i + 1)
                if close < 0:
                    raise _Unfinished
                parts.append(code[i + 1:close])
                i, quoted = close + 1, True
            elif c == '"':
                i = self._read_dquoted_delimiter(i + 1, parts)
                quoted = True
            elif c == "\\":
                if i + 1 >= n:
                    raise _Unfinished
                if code[i + 1] != "\n":
                    parts.append(code[i + 1])
                    quoted = True
                i += 2
            else:
                match = _DELIM_PLAIN.match(code, i)
                text = match.group() if match else c
                parts.append(text)
                i += len(text)
        if not parts and not quoted:
            raise _Invalid  # `cat <<` with no word
        self.heredocs.append(("".join(parts), strip_tabs))
        self.pos = i

    def _read_dquoted_delimiter(self, i: int, parts: list[str]) -> int:
        code, n = self.code, self.n
        while i < n:
            c = code[i]
            if c == '"':
                return i + 1
            if c == "\\" and i + 1 < n and code[i + 1] in '"\\$`\n':
                if code[i + 1] != "\n":
                    parts.append(code[i + 1])
                i += 2
                continue
            parts.append(c)
            i += 1
        raise _Unfinished

    def _read_heredocs(self) -> None:
        """After the newline that ends their command: each document's lines, up to its delimiter."""
        code, n = self.code, self.n
        for delimiter, strip_tabs in self.heredocs:
            while True:
                if self.pos >= n:
                    raise _Unfinished
                end = code.find("\n", self.pos)
                line = code[self.pos:n if end < 0 else end]
                self.pos = n if end < 0 else end + 1
                if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                    break
                if end < 0:
                    raise _Unfinished
        self.heredocs.clear()

    # ----- lexical frames

    def _step_lexical(self, frame: _Lexical) -> None:
        kind = frame.kind
        if kind == SQUOTE:
            close = self.code.find("'", self.pos)
            self.pos = self.n if close < 0 else close + 1
            if close >= 0:
                self.frames.pop()
            return
        match = _STOPS[kind].search(self.code, self.pos)
        if match is None:
            self.pos = self.n
            return
        c = match.group()
        self.pos = match.start()
        if c == "\\":
            self.pos = min(self.pos + 2, self.n)
        elif c == "$":
            self._dollar(quotes=kind != DQUOTE)
        elif kind in (ANSIC, BACKTICK, DQUOTE) and c == kind[-1]:
            self.pos += 1
            self.frames.pop()
        elif c in "'\"`":
            self.pos += 1
            self.frames.append(_Lexical(c))
        else:
            self._bracket(frame, c)

    def _bracket(self, frame: _Lexical, c: str) -> None:
        """Brackets in `${...}`, `$((...))`, `((...))`, `@(...)`, `$( (...) )` and subscripts: nest or close."""
        self.pos += 1
        if c in "({[":
            frame.depth += 1
        elif frame.depth:
            frame.depth -= 1
        elif frame.kind == SUBSCRIPT:
            self.frames.pop()
            ctx = self.frames[-1]
            assert isinstance(ctx, _Context)
            ctx.buf.append(self.code[frame.start:self.pos])  # `a[1]=(` is still an assignment
        elif frame.kind != ARITH:
            self.frames.pop()
        elif self.code.startswith(")", self.pos):
            self.pos += 1
            self.frames.pop()
            if frame.then:
                ctx = self.frames[-1]
                assert isinstance(ctx, _Context)
                ctx.state = frame.then
        else:
            # `$((` whose first `(` closes alone was `$( (...) ...)`. Like bash, only match the
            # parentheses: one is still open. (A `((` command was checked before it was opened.)
            frame.kind = PARENS
