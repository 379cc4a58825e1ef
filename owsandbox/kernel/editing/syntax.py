"""The words of the bash lexer that decides whether a cell is complete (completeness.py): its frames,
the states a command context moves through, the tokens it knows, and the two ways it stops early.

A frame is a command context (text read as commands: the cell, `$(...)`, `<(...)`, the words of
`name=(...)`), with its own stack of open compound commands, or a lexical frame (a quote, `${...}`,
`$((...))`, ...: text inside a word).
"""

from __future__ import annotations

import re

COMPLETE = "complete"
INCOMPLETE = "incomplete"
INVALID = "invalid"
INDENT = "    "


class Invalid(Exception):
    """A token that nothing open can accept."""


class Unfinished(Exception):
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

SIMPLE_STATES = frozenset({CMD, ARGS, AFTER, COPROC, COPROC_NAME})
RESERVED = frozenset(
    "if then elif else fi for while until select do done case esac in function { } ! time [[ ]] coproc".split()
)
OPENERS = frozenset("if for while until select case function { ! time [[ coproc".split())
COMPOUND_STARTS = frozenset("if for while until select case { [[".split())

BLANKS = re.compile(r"[ \t]+")
PLAIN = re.compile(r"[^ \t\n;&|()<>'\"`\\$]+")
DELIM_PLAIN = re.compile(r"[^ \t\n;&|()<>'\"\\]+")
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\[[^\]]*\])?\+?=")
SUBSCRIPT_START = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\[")
DECLARATIONS = frozenset("declare typeset local export readonly".split())
IO_NUMBER = re.compile(r"[0-9]+|\{[A-Za-z_][A-Za-z0-9_]*\}")
STOPS = {
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
ARITH_SCAN = re.compile(r"[()'\"\\]")
WORD = re.compile(r"[^ \t\n;&|()<>'\"`\\$#][^ \t\n;&|()<>'\"`\\$]*(?=[ \t\n;&|)]|\Z)")
OPERATOR = re.compile(r";;&|;;|;&|;|&&|&>>|&>|&|\|\||\|&|\||<<<|<<-|<<|<&|<>|<|>>|>&|>\||>|\(|\)")
SEPARATORS = frozenset({";", "&"})
CASE_ENDS = frozenset({";;", ";&", ";;&"})
CONNECTORS = frozenset({"|", "|&", "&&", "||"})
OPERATOR_CHARS = frozenset(";&|<>()")
COND_OPERATORS = frozenset({"&&", "||", "(", ")", "<", ">", "|"})  # `|` for `=~ a|b`


class Context:
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


class Lexical:
    """A quote, `${...}`, `$((...))`, `((...))`, a subscript or a pattern's `@(...)`: inside a word."""

    __slots__ = ("kind", "depth", "then", "start")

    def __init__(self, kind: str, then: str = "", start: int = 0) -> None:
        self.kind = kind
        self.depth = 0
        self.then = then  # for `((`: what the context expects once it closes
        self.start = start  # for a subscript: where its text starts
