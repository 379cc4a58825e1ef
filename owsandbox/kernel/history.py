"""The cells a kernel ran: the one record of them, for Jupyter's history requests and for completion."""

from __future__ import annotations

from collections import deque


class CellHistory:
    """The cells this kernel ran, for history requests (in memory: session 1 is this kernel).

    Bounded twice, so that a kernel that lives for days holds a fixed amount whatever its cells are:
    the newest `keep` cells, and of those no more than `keep_chars` characters of code (a notebook that
    pastes data into its cells would otherwise keep every copy). The newest cell is always kept."""

    SESSION = 1

    def __init__(self, keep: int = 10000, keep_chars: int = 8 * 1024 * 1024) -> None:
        self.entries: deque[tuple[int, int, str]] = deque()
        self.keep = keep
        self.keep_chars = keep_chars
        self._chars = 0

    def add(self, line: int, code: str) -> None:
        self.entries.append((self.SESSION, line, code))
        self._chars += len(code)
        while len(self.entries) > 1 and (len(self.entries) > self.keep or self._chars > self.keep_chars):
            self._chars -= len(self.entries.popleft()[2])

    def codes(self, last: int) -> list[str]:
        """The code of the `last` cells run, oldest first (completion offers the names they assigned)."""
        return [code for _session, _line, code in list(self.entries)[-last:]]

    def query(self, kind: str, session: int | None, start: int | None, stop: int | None, n: int | None,
              pattern: str | None, unique: bool) -> list[tuple[int, int, str]]:
        import fnmatch

        if kind == "tail":
            return list(self.entries)[-n:] if n else list(self.entries)
        if kind == "range":
            wanted = self.SESSION if session in (None, 0) or session < 0 else session
            return [e for e in self.entries if e[0] == wanted and (start or 0) <= e[1] < (stop or 1 << 62)]
        if kind == "search":
            found = [e for e in self.entries if fnmatch.fnmatch(e[2], pattern or "*")]
            if unique:
                seen: dict[str, tuple[int, int, str]] = {}
                for entry in found:
                    seen.pop(entry[2], None)
                    seen[entry[2]] = entry
                found = list(seen.values())
            return found[-n:] if n else found
        return []
