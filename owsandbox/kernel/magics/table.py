"""The magics a kernel knows, in one table the kernel builds (`all_magics`): nothing registers itself
on import, so what a cell may call is the list below, and a test can build the same table.

The table finds a magic for a cell (`find`, with a hint for a misspelt or misused one), names them
all for completion (`names`), and is a mapping of (kind, name) to `Magic` for `%magics` and `--help`.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator, Mapping

from ..errors import UsageError
from . import attach as attach_magics
from . import files as file_magics
from . import preview as preview_magics
from . import sandbox as sandbox_magics
from . import shells as shell_magics
from . import teaching as teaching_magics
from .framework import Magic, magic_prefix


class MagicTable(Mapping[tuple[str, str], Magic]):
    def __init__(self, listed: Iterable[Magic]) -> None:
        self._magics: dict[tuple[str, str], Magic] = {}
        for found in listed:
            key = (found.kind, found.name)
            if key in self._magics:
                raise ValueError(f"{found.spelled} is listed twice")
            self._magics[key] = found

    def __getitem__(self, key: tuple[str, str]) -> Magic:
        return self._magics[key]

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._magics)

    def __len__(self) -> int:
        return len(self._magics)

    def find(self, kind: str, name: str) -> Magic:
        """The `kind` ("line" or "cell") magic called `name`; a UsageError that says what to write instead."""
        found = self._magics.get((kind, name))
        if found is not None:
            return found
        spelled = magic_prefix(kind) + name
        other = self._magics.get(("line" if kind == "cell" else "cell", name))
        if other is not None:
            raise UsageError(f"{spelled} is not a {kind} magic; use {other.spelled}")
        close = difflib.get_close_matches(spelled, self.names(), n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]}?" if close else "; %magics lists them"
        raise UsageError(f"unknown magic {spelled}{hint}")

    def names(self) -> list[str]:
        """Every magic as a cell writes it (`%ls`, `%%write`), sorted."""
        return sorted({found.spelled for found in self._magics.values()})


def all_magics() -> MagicTable:
    return MagicTable([*file_magics.FILE_MAGICS, *shell_magics.SHELL_MAGICS, *attach_magics.ATTACH_MAGICS,
                       *sandbox_magics.SANDBOX_MAGICS, *teaching_magics.TEACHING_MAGICS,
                       *preview_magics.PREVIEW_MAGICS])
