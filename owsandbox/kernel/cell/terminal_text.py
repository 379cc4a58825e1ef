"""Terminal output reduced to what a notebook can show.

A command on a terminal writes for a screen: it moves the cursor, erases lines, hides the cursor,
sets the window title, wraps links in OSC 8. A notebook's output area is not a screen: JupyterLab
renders SGR colour sequences (`ESC [ ... m`) and handles `\\r` and `\\b`, and prints anything else
as garbage (`[K`, `]0;title`). `TerminalText` keeps SGR, `\\r`, `\\n`, `\\t` and `\\b`, and drops
every other control: other CSI sequences, OSC sequences (a hyperlink keeps its text, only the
link is lost), DCS/SOS/PM/APC strings, two-character escapes, and the other C0/C1 controls.

It is a state machine fed chunks as they arrive: a sequence split between two frames is held until
its end comes, so what `feed` returns never holds part of a sequence. A sequence that never ends
(longer than a terminal would accept) is dropped, and `end` drops whatever is left unfinished.
Sans-I/O and not thread-safe: one instance per stream, fed under its owner's lock.
"""

from __future__ import annotations

import re

ESC = "\x1b"
# The controls that are dropped (or start a sequence): all C0 but \b \t \n \r, DEL, all C1.
_DROPPED = re.compile("[\x00-\x07\x0b\x0c\x0e-\x1f\x7f-\x9f]")
# ASCII that passes as it is: printable characters, \b, \t, \n and \r (the complement of _DROPPED's ASCII).
_KEPT_ASCII = bytes([8, 9, 10, 13, *range(0x20, 0x7F)])
_SGR = re.compile("\x1b\\[[0-9;:]*m")
_MAX_CSI = 64  # characters of parameters and intermediates; longer is not a sequence a program meant
_MAX_OSC = 8192  # characters of an OSC string (a long hyperlink fits; a title never has a line break)
_MAX_STRING = 1 << 20  # characters of a DCS/SOS/PM/APC string (sixel images are long); only counted

# states
_TEXT, _ESC, _ESC_INTER, _CSI, _OSC, _OSC_ESC, _STR, _STR_ESC = range(8)
_NOT_PART = -1  # `_step`'s answer: the character is not part of the sequence, which is dropped


class TerminalText:
    """Feed text as it arrives; get back the text a notebook can show (see the module's docstring)."""

    def __init__(self) -> None:
        self._state = _TEXT
        self._seq: list[str] = []  # the CSI parameters and intermediates seen so far
        self._length = 0  # characters in the current sequence, for the caps

    def feed(self, text: str) -> str:
        if self._state == _TEXT and text.isascii() and not text.encode("ascii").translate(None, _KEPT_ASCII):
            return text  # the common case, checked at C speed: nothing in it to take out
        out: list[str] = []
        state = self._state
        index, size = 0, len(text)
        while index < size:
            if state == _TEXT:  # plain text is copied in runs, up to the next control to drop
                found = _DROPPED.search(text, index)
                if found is None:
                    out.append(text[index:])
                    break
                if found.start() > index:
                    out.append(text[index : found.start()])
                state = self._begin(found.group())
                index = found.end()
                continue
            following = self._step(state, text[index], out)
            if following == _NOT_PART:
                state = _TEXT  # the broken sequence is dropped; this character is read again as text
                continue
            state = following
            index += 1
        self._state = state
        return "".join(out)

    def end(self) -> str:
        """The stream ended: an unfinished sequence is dropped (nothing of it is ever shown)."""
        self._state = _TEXT
        self._seq = []
        self._length = 0
        return ""

    @property
    def pending(self) -> bool:
        """True while part of a sequence is held, waiting for its end."""
        return self._state != _TEXT

    # -- the machine -----------------------------------------------------------------------

    def _begin(self, char: str) -> int:
        """The state after a control character that is dropped: some start a sequence."""
        self._seq = []
        self._length = 0
        if char == ESC:
            return _ESC
        if char == "\x9b":
            return _CSI
        if char == "\x9d":
            return _OSC
        if char in "\x90\x98\x9e\x9f":  # DCS, SOS, PM, APC
            return _STR
        return _TEXT  # any other control is dropped alone

    def _step(self, state: int, char: str, out: list[str]) -> int:
        """One character inside a sequence: the next state, or _NOT_PART."""
        self._length += 1
        if state == _ESC:
            if char == "[":
                return _CSI
            if char == "]":
                return _OSC
            if char in "PX^_":
                return _STR
            if "\x20" <= char <= "\x2f":
                return _ESC_INTER
            if "\x30" <= char <= "\x7e":
                return _TEXT  # a two-character escape (ESC 7, ESC =, ESC M, ESC c, ...): dropped
            return _NOT_PART
        if state == _ESC_INTER:  # ESC ( B and friends: intermediates, then one final character
            if "\x20" <= char <= "\x2f" and self._length < _MAX_CSI:
                return _ESC_INTER
            if "\x30" <= char <= "\x7e":
                return _TEXT
            return _NOT_PART
        if state == _CSI:
            if "\x20" <= char <= "\x3f":
                if self._length > _MAX_CSI:
                    return _NOT_PART
                self._seq.append(char)
                return _CSI
            if "\x40" <= char <= "\x7e":
                if char == "m" and self._is_sgr():
                    out.append(ESC + "[" + "".join(self._seq) + "m")
                self._seq = []
                return _TEXT
            return _NOT_PART
        if state == _OSC:  # ended by BEL or ST; a line break or an endless string means it was no OSC
            if char in "\x07\x9c":
                return _TEXT
            if char == ESC:
                return _OSC_ESC
            if char == "\n" or self._length > _MAX_OSC:
                return _NOT_PART
            return _OSC
        if state == _STR:  # ended by ST only
            if char == "\x9c":
                return _TEXT
            if char == ESC:
                return _STR_ESC
            if self._length > _MAX_STRING:
                return _NOT_PART
            return _STR
        # _OSC_ESC, _STR_ESC: ESC \ ends the string; ESC then anything else ends it and starts anew
        if char == "\\":
            return _TEXT
        self._seq = []
        self._length = 0
        return self._step(_ESC, char, out)

    def _is_sgr(self) -> bool:
        """Select Graphic Rendition as JupyterLab reads it: digits, `;` and `:` only (no private marks
        such as `ESC[>4;2m`, no intermediates)."""
        return all(c.isdigit() or c in ";:" for c in self._seq)


def shown_text(text: str) -> str:
    """`text` from the box as a terminal may be given it: colours (SGR), `\\r`, `\\n` and `\\t` kept, every
    other control and sequence dropped (an unfinished one at the end too). The one filter for whatever
    the kernel shows of the box outside a command's own output (file names, file text, folders, error
    messages, completions): there a window title, the clipboard (OSC 52) or a cleared screen would be
    the box's doing, and even a backspace could rewrite what the user reads."""
    return TerminalText().feed(text).replace("\b", "")


def plain(text: str) -> str:
    """`text` with every sequence and control dropped but line breaks and tabs, colours too: for a
    prompt, which JupyterLab and the console show as plain text."""
    return _SGR.sub("", TerminalText().feed(text)).replace("\b", "")
