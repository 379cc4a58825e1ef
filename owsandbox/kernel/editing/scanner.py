"""The bash lexer that decides whether a cell is complete (completeness.py): one pass over the text,
a stack of frames (command contexts and lexical frames), words and operators handed to the grammar
(grammar.py), here-documents read after the newline that ends their command.
"""

from __future__ import annotations

from .grammar import Grammar
from .syntax import (
    ANSIC,
    ARGS,
    ARITH,
    ARITH_SCAN,
    ARRAY,
    ASSIGNMENT,
    BACKTICK,
    BLANKS,
    CASE_BODY,
    CMD,
    CMDSUB,
    COMPLETE,
    DELIM_PLAIN,
    DQUOTE,
    EXTGLOB,
    IN_COND,
    INCOMPLETE,
    INDENT,
    IO_NUMBER,
    OLD_ARITH,
    OPERATOR,
    OPERATOR_CHARS,
    PARAM,
    PARENS,
    PLAIN,
    PROCSUB,
    SIMPLE_STATES,
    SQUOTE,
    STOPS,
    SUBSCRIPT,
    SUBSCRIPT_START,
    TOP,
    WORD,
    Context,
    Invalid,
    Lexical,
    Unfinished,
)


class Scanner(Grammar):
    """One pass over a cell: words, operators, quotes, expansions and here-documents read, each handed
    to the grammar (`Grammar`) in the context it is read in."""

    def __init__(self, code: str) -> None:
        self.code = code
        self.n = len(code)
        self.pos = 0
        self.frames: list[Context | Lexical] = [Context(TOP)]
        self.heredocs: list[tuple[str, bool]] = []
        self.paren_matches: dict[int, int] = {}  # `(` position -> its `)` (-1: none), for `((`
        self.line_starts: list[int] | None = None  # where lines start at the top level, when asked (line_starts)

    def run(self) -> tuple[str, str]:
        frames = self.frames
        while self.pos < self.n:
            top = frames[-1]
            if isinstance(top, Context):
                self._scan_context(top)
            else:
                self._step_lexical(top)
        return self._at_end()

    # ----- the end of the text

    def _at_end(self) -> tuple[str, str]:
        top = self.frames[-1]
        if not isinstance(top, Context):
            raise Unfinished
        self._end_word(top)
        self._newline(top)  # the frontend's next character: where bash rejects a newline, say so now
        if self.heredocs:
            raise Unfinished
        if len(self.frames) > 1 or top.blocks or top.need_cmd or top.state not in SIMPLE_STATES:
            return INCOMPLETE, INDENT * self._levels()
        return COMPLETE, ""

    def _levels(self) -> int:
        levels = 0
        for frame in self.frames:
            if isinstance(frame, Context):
                levels += (frame.kind != TOP) + len(frame.blocks) + frame.blocks.count(CASE_BODY)
        return levels

    # ----- command contexts

    def _scan_context(self, ctx: Context) -> None:
        """Read commands until the text ends, or another frame opens, or this one closes."""
        code, n, frames = self.code, self.n, self.frames
        while self.pos < n and frames[-1] is ctx:
            pos = self.pos
            c = code[pos]
            if c == " " or c == "\t":
                if ctx.in_word:
                    self._end_word(ctx)
                pos = self.pos = BLANKS.match(code, pos).end()
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
            elif c in OPERATOR_CHARS:
                self._operator(ctx, c)
            elif not ctx.in_word and (word := self._whole_word(ctx, pos)):
                self.pos = pos + len(word)
                self._finish_word(ctx, word, word)
            else:
                self._word_part(ctx, c)

    def _whole_word(self, ctx: Context, pos: int) -> str:
        """The fast path: an unquoted word with nothing special in it, or ""."""
        match = WORD.match(self.code, pos)
        if match is None:
            return ""
        word = match.group()
        if "[" in word and self._subscript_cut(ctx, word) >= 0:
            return ""
        return word

    def _word_part(self, ctx: Context, c: str) -> None:
        code, pos = self.code, self.pos
        if c == "\\":
            if pos + 1 >= self.n:
                raise Unfinished  # a continuation on the last line
            self.pos = pos + 2
            if code[pos + 1] != "\n":
                self._begin_word(ctx, plain=False)
            return
        if c in "'\"`":
            self._begin_word(ctx, plain=False)
            self.frames.append(Lexical(c))
            self.pos = pos + 1
        elif c == "$":
            self._begin_word(ctx, plain=False)
            self._dollar(quotes=True)
        else:
            match = PLAIN.match(code, pos)
            text = match.group() if match else c
            cut = self._subscript_cut(ctx, text) if "[" in text else -1
            if cut >= 0:
                text = text[:cut]
                self.frames.append(Lexical(SUBSCRIPT, start=pos + cut))
            self._begin_word(ctx, plain=True)
            ctx.buf.append(text)
            ctx.last = text[-1:]
            self.pos = pos + len(text)

    @staticmethod
    def _subscript_cut(ctx: Context, text: str) -> int:
        """Where `name[` in an assignment's place (or `[` opening a word in `arr=(...)`) ends, else -1."""
        if ctx.kind == ARRAY:
            return 1 if text[0] == "[" and not ctx.in_word else -1
        if not (ctx.arrays and not ctx.declaring and ctx.plain and ctx.state in (CMD, ARGS)):
            return -1
        before = "".join(ctx.buf) if ctx.in_word else ""
        match = SUBSCRIPT_START.match(before + text)
        if match is None or match.end() <= len(before):
            return -1
        return match.end() - len(before)

    @staticmethod
    def _begin_word(ctx: Context, plain: bool) -> None:
        ctx.in_word = True
        ctx.last = ""
        if not plain:
            ctx.plain = False

    def _end_word(self, ctx: Context) -> None:
        if not ctx.in_word:
            return
        literal = "".join(ctx.buf)
        text = literal if ctx.plain else None
        ctx.in_word, ctx.plain, ctx.buf, ctx.last = False, True, [], ""
        self._finish_word(ctx, literal, text)

    def _finish_word(self, ctx: Context, literal: str, text: str | None) -> None:
        self._word(ctx, text)
        if ctx.state == ARGS and ctx.arrays and not ctx.declaring:
            ctx.arrays = ASSIGNMENT.match(literal) is not None

    def _dollar(self, quotes: bool) -> None:
        """At a `$`: open what it starts (`$'` and `$"` only where quotes are quotes)."""
        code, pos = self.code, self.pos
        nxt = code[pos + 1] if pos + 1 < self.n else ""
        if nxt == "(":
            if code.startswith("(", pos + 2):
                self.frames.append(Lexical(ARITH))  # may turn out to be `$( (...) ...)`: see _bracket
                self.pos += 1
            else:
                self.frames.append(Context(CMDSUB))
            self.pos += 2
        elif nxt == "{" or nxt == "[":
            self.frames.append(Lexical(PARAM if nxt == "{" else OLD_ARITH))
            self.pos = pos + 2
        elif quotes and nxt in ("'", '"'):
            self.frames.append(Lexical(ANSIC if nxt == "'" else DQUOTE))
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
            match = ARITH_SCAN.search(code, i)
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

    def _operator(self, ctx: Context, c: str) -> None:
        code, pos = self.code, self.pos
        nxt = code[pos + 1] if pos + 1 < self.n else ""
        if c == "(" and ctx.in_word and self._paren_in_word(ctx):
            return
        if c in "<>" and nxt == "(" and ctx.state != IN_COND:
            self._begin_word(ctx, plain=False)  # process substitution, part of a word
            self.frames.append(Context(PROCSUB))
            self.pos = pos + 2
            return
        if c in "<>" and ctx.in_word and ctx.plain and IO_NUMBER.fullmatch("".join(ctx.buf)):
            ctx.in_word, ctx.buf, ctx.last = False, [], ""  # `2>`, `{fd}>`: part of the redirection
        else:
            self._end_word(ctx)
        op = OPERATOR.match(code, pos).group()
        self.pos = pos + len(op)
        self._op(ctx, op)

    def _paren_in_word(self, ctx: Context) -> bool:
        """`name=(` opens an array; `@(`, `!(`, `*(`, `+(`, `?(` open an extended pattern."""
        if ctx.arrays and ctx.plain and ctx.state in (CMD, ARGS) and ASSIGNMENT.fullmatch("".join(ctx.buf)):
            self.frames.append(Context(ARRAY))
        elif ctx.last and ctx.last in "?*+@!":
            self.frames.append(Lexical(EXTGLOB))
        else:
            return False
        self._begin_word(ctx, plain=False)
        self.pos += 1
        return True

    # ----- here-documents

    def _heredoc_delimiter(self, strip_tabs: bool) -> None:
        """After `<<` or `<<-`: read the word whose unquoted text ends the document."""
        code, n = self.code, self.n
        match = BLANKS.match(code, self.pos)
        i = match.end() if match else self.pos
        parts: list[str] = []
        quoted = False
        while i < n and code[i] not in " \t\n;&|()<>":
            c = code[i]
            if c == "'":
                close = code.find("'", i + 1)
                if close < 0:
                    raise Unfinished
                parts.append(code[i + 1:close])
                i, quoted = close + 1, True
            elif c == '"':
                i = self._read_dquoted_delimiter(i + 1, parts)
                quoted = True
            elif c == "\\":
                if i + 1 >= n:
                    raise Unfinished
                if code[i + 1] != "\n":
                    parts.append(code[i + 1])
                    quoted = True
                i += 2
            else:
                match = DELIM_PLAIN.match(code, i)
                text = match.group() if match else c
                parts.append(text)
                i += len(text)
        if not parts and not quoted:
            raise Invalid  # `cat <<` with no word
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
        raise Unfinished

    def _read_heredocs(self) -> None:
        """After the newline that ends their command: each document's lines, up to its delimiter."""
        code, n = self.code, self.n
        for delimiter, strip_tabs in self.heredocs:
            while True:
                if self.pos >= n:
                    raise Unfinished
                end = code.find("\n", self.pos)
                line = code[self.pos:n if end < 0 else end]
                self.pos = n if end < 0 else end + 1
                if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                    break
                if end < 0:
                    raise Unfinished
        self.heredocs.clear()

    # ----- lexical frames

    def _step_lexical(self, frame: Lexical) -> None:
        kind = frame.kind
        if kind == SQUOTE:
            close = self.code.find("'", self.pos)
            self.pos = self.n if close < 0 else close + 1
            if close >= 0:
                self.frames.pop()
            return
        match = STOPS[kind].search(self.code, self.pos)
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
            self.frames.append(Lexical(c))
        else:
            self._bracket(frame, c)

    def _bracket(self, frame: Lexical, c: str) -> None:
        """Brackets in `${...}`, `$((...))`, `((...))`, `@(...)`, `$( (...) )` and subscripts: nest or close."""
        self.pos += 1
        if c in "({[":
            frame.depth += 1
        elif frame.depth:
            frame.depth -= 1
        elif frame.kind == SUBSCRIPT:
            self.frames.pop()
            ctx = self.frames[-1]
            assert isinstance(ctx, Context)
            ctx.buf.append(self.code[frame.start:self.pos])  # `a[1]=(` is still an assignment
        elif frame.kind != ARITH:
            self.frames.pop()
        elif self.code.startswith(")", self.pos):
            self.pos += 1
            self.frames.pop()
            if frame.then:
                ctx = self.frames[-1]
                assert isinstance(ctx, Context)
                ctx.state = frame.then
        else:
            # `$((` whose first `(` closes alone was `$( (...) ...)`. Like bash, only match the
            # parentheses: one is still open. (A `((` command was checked before it was opened.)
            frame.kind = PARENS
