"""The grammar of the bash lexer (completeness.py): what a whole word or an operator does to the command
context it is read in. A word is a reserved word only where bash recognises one (a command's start,
after a compound command); each compound command opens a block that only its own closing word ends,
and each token that nothing open can take is `Invalid`.

`Grammar` is the half of `Scanner` (scanner.py) that knows bash's structure; the scanner reads the
text into words and operators, and keeps the position, the frames and the here-documents it uses.
"""

from __future__ import annotations

from .syntax import (
    AFTER,
    ARGS,
    ARITH,
    ARRAY,
    BLANKS,
    CASE_BODY,
    CASE_ENDS,
    CASE_HEAD,
    CASE_IN,
    CASE_PAT,
    CASE_PAT_MORE,
    CASE_PAT_WORD,
    CASE_WORD,
    CMD,
    CMDSUB,
    COMPOUND_STARTS,
    COND,
    COND_OPERATORS,
    CONNECTORS,
    COPROC,
    COPROC_NAME,
    DECLARATIONS,
    FOR_ARITH,
    FOR_IN,
    FOR_NAME,
    FOR_WORDS,
    FUNC_AFTER_NAME,
    FUNC_BODY,
    FUNC_NAME,
    FUNC_PAREN,
    GROUP,
    IF_COND,
    IF_ELSE,
    IF_THEN,
    IN_COND,
    LOOP_BODY,
    LOOP_HEAD,
    OPENERS,
    PRE_DO,
    PROCSUB,
    REDIR,
    RESERVED,
    SEPARATORS,
    SIMPLE_STATES,
    SUBSHELL,
    Context,
    Invalid,
    Lexical,
)


class Grammar:
    """What words and operators do to a context; `Scanner` (scanner.py) reads them and calls these."""

    code: str
    pos: int
    frames: list[Context | Lexical]

    def _is_arithmetic(self, start: int) -> bool:
        """Whether the `((` before `start` opens arithmetic (the scanner matches the parentheses)."""
        raise NotImplementedError

    def _heredoc_delimiter(self, strip_tabs: bool) -> None:
        """After `<<` or `<<-`: the scanner reads the delimiter word."""
        raise NotImplementedError

    # ----- the grammar: words

    def _word(self, ctx: Context, text: str | None) -> None:
        """A whole word; `text` is None when quoting or expansions make it no reserved word."""
        state = ctx.state
        if ctx.kind == ARRAY:
            return
        if state == CMD or state == AFTER:
            if text in RESERVED:
                self._reserved(ctx, text)
            elif state == AFTER:
                raise Invalid  # `(ls) a`, `fi x`
            else:
                ctx.state, ctx.words, ctx.need_cmd, ctx.empty = ARGS, 1, False, False
                ctx.declaring = text in DECLARATIONS
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
        elif state in (FUNC_AFTER_NAME, FUNC_BODY) and text in COMPOUND_STARTS:
            ctx.state = CMD
            self._open(ctx, text)
        else:  # `f() echo`: a body must be a compound command; `f(` wants `)`
            raise Invalid

    def _reserved(self, ctx: Context, word: str) -> None:
        if word in OPENERS:
            if ctx.state == AFTER:
                raise Invalid  # e.g. `fi if`: a command cannot start here
            self._open(ctx, word)
        elif ctx.need_cmd or word in ("in", "]]"):
            raise Invalid
        else:
            self._close(ctx, word)

    def _open(self, ctx: Context, word: str) -> None:
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

    def _close(self, ctx: Context, word: str) -> None:
        """then, elif, else, fi, do, done, esac, `}`: each valid only on top of its opener."""
        top = ctx.blocks[-1] if ctx.blocks else None
        moves = {
            "then": (IF_COND, IF_THEN), "elif": (IF_THEN, IF_COND), "else": (IF_THEN, IF_ELSE),
            "do": (LOOP_HEAD, LOOP_BODY),
        }
        if word in moves:
            before, after = moves[word]
            if top != before:
                raise Invalid
            ctx.blocks[-1] = after
            self._command_start(ctx)
            return
        openers = {"fi": (IF_THEN, IF_ELSE), "done": (LOOP_BODY,), "esac": (CASE_BODY,), "}": (GROUP,)}
        if top not in openers[word]:
            raise Invalid
        ctx.blocks.pop()
        ctx.state = AFTER

    @staticmethod
    def _command_start(ctx: Context) -> None:
        ctx.state, ctx.empty, ctx.words, ctx.arrays, ctx.declaring = CMD, True, 0, True, False

    def _coproc_word(self, ctx: Context, text: str | None) -> None:
        """`coproc cmd args`, `coproc { ...; }` or `coproc NAME { ...; }`."""
        if text in COMPOUND_STARTS:
            ctx.state = CMD
            self._open(ctx, text)
        elif ctx.state == COPROC:
            ctx.state, ctx.words, ctx.empty = COPROC_NAME, 1, False
        else:
            ctx.state, ctx.words = ARGS, 2

    def _for_word(self, ctx: Context, text: str | None) -> None:
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
            raise Invalid

    def _case_word(self, ctx: Context, text: str | None) -> None:
        state = ctx.state
        if state == CASE_WORD:
            ctx.state = CASE_IN
        elif state == CASE_IN:
            if text != "in":
                raise Invalid
            ctx.state = CASE_PAT
        elif state == CASE_PAT and text == "esac":
            ctx.blocks.pop()
            ctx.state = AFTER
        elif state in (CASE_PAT, CASE_PAT_WORD):
            ctx.state = CASE_PAT_MORE
        else:  # two words in one pattern
            raise Invalid

    # ----- the grammar: operators and newlines

    def _op(self, ctx: Context, op: str) -> None:
        state = ctx.state
        if ctx.kind == ARRAY:
            if op != ")":
                raise Invalid
            self.frames.pop()
        elif state in SIMPLE_STATES:
            self._command_op(ctx, op)
        elif state == IN_COND:
            if op not in COND_OPERATORS:
                raise Invalid
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
            raise Invalid

    def _next_nonblank(self) -> str:
        match = BLANKS.match(self.code, self.pos)
        i = match.end() if match else self.pos
        return self.code[i:i + 1]

    def _command_op(self, ctx: Context, op: str) -> None:
        state = ctx.state
        if op in SEPARATORS or op in CONNECTORS:
            if (state == CMD and (ctx.empty or ctx.need_cmd)) or state == COPROC:
                raise Invalid
            self._command_start(ctx)
            ctx.need_cmd = op in CONNECTORS
        elif op in CASE_ENDS:
            if ctx.need_cmd or not ctx.blocks or ctx.blocks[-1] != CASE_BODY:
                raise Invalid
            ctx.blocks[-1] = CASE_HEAD
            ctx.state = CASE_PAT
        elif op == "(":
            self._open_paren(ctx)
        elif op == ")":
            self._close_paren(ctx)
        else:
            self._redirection(ctx, op)

    def _open_paren(self, ctx: Context) -> None:
        state = ctx.state
        if state in (CMD, COPROC, COPROC_NAME):
            ctx.need_cmd = False
            if not self._arithmetic_command(ctx, then=AFTER):
                ctx.blocks.append(SUBSHELL)
                self._command_start(ctx)
        elif state == ARGS and ctx.words == 1:
            ctx.state = FUNC_PAREN  # `name (`
        else:
            raise Invalid

    def _arithmetic_command(self, ctx: Context, then: str) -> bool:
        """At `((` of `(( expr ))` or `for ((;;))`: open it and say so."""
        if not (self.code.startswith("(", self.pos) and self._is_arithmetic(self.pos + 1)):
            return False
        self.frames.append(Lexical(ARITH, then=then))
        self.pos += 1
        ctx.empty = False
        return True

    def _close_paren(self, ctx: Context) -> None:
        if ctx.need_cmd:
            raise Invalid
        if ctx.blocks:
            if ctx.blocks[-1] != SUBSHELL:
                raise Invalid
            ctx.blocks.pop()
            ctx.state = AFTER
        elif ctx.kind in (CMDSUB, PROCSUB):
            self.frames.pop()
        else:
            raise Invalid

    def _case_op(self, ctx: Context, op: str) -> None:
        state = ctx.state
        if op == "(" and state == CASE_PAT:
            ctx.state = CASE_PAT_WORD
        elif op == "|" and state == CASE_PAT_MORE:
            ctx.state = CASE_PAT_WORD
        elif op == ")" and state == CASE_PAT_MORE:
            ctx.blocks[-1] = CASE_BODY
            self._command_start(ctx)
        else:
            raise Invalid

    def _redirection(self, ctx: Context, op: str) -> None:
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

    def _newline(self, ctx: Context) -> None:
        state = ctx.state
        if ctx.kind == ARRAY or state in (FOR_IN, PRE_DO, CASE_IN, CASE_PAT, FUNC_AFTER_NAME, FUNC_BODY):
            return
        if state in SIMPLE_STATES and state != COPROC:
            if not ctx.need_cmd:
                self._command_start(ctx)
        elif state in (FOR_WORDS, FOR_ARITH):
            ctx.state = PRE_DO
        elif state != IN_COND or not ctx.cond_nl_ok:
            raise Invalid  # a redirection's target, `for`, `case`, `function`, `coproc`, `f(`, in a pattern
