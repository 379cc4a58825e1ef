"""Counts in words: `1 entry`, `2 entries`, never `1 entries`.

Shared by the box, the host and the kernel (the box's zipapp holds only `box` and `protocol`, so it lives
here). Standard library only.
"""

from __future__ import annotations


def noun(count: object, word: str, words: str = "") -> str:
    """The noun that goes with `count`: `word` for one, else `words` (default: `word` + "s")."""
    return word if count == 1 else words or word + "s"


def counted(count: object, word: str, words: str = "") -> str:
    """`count` and the noun that goes with it: `word` for one, else `words` (default: `word` + "s"),
    with thousands separated (`1,024 files`); a count that is not a number (read from a file) is shown as is."""
    shown = f"{count:,}" if isinstance(count, (int, float)) else str(count)
    return f"{shown} {noun(count, word, words)}"
