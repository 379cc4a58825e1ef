"""What a snapshot operation reports: a snapshot's facts, a save's and a restore's counts and notes."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SnapshotInfo:
    name: str
    created: float
    files: int
    folders: int
    links: int
    bytes: int
    source: str


@dataclass
class SaveReport:
    name: str
    files: int = 0
    folders: int = 0
    links: int = 0
    bytes: int = 0  # of the files saved
    read_bytes: int = 0  # what had to be read (the rest was unchanged since the last save)
    new_bytes: int = 0  # what the store holds more now
    store_bytes: int = 0
    limit: int = 0
    replaced: bool = False
    skipped: list[tuple[str, str]] = field(default_factory=list)
    excluded: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class RestoreReport:
    name: str
    written: int = 0  # files written back (changed or deleted since the save)
    unchanged: int = 0
    removed: int = 0  # entries added since the save, removed
    folders: int = 0  # folders made again
    links: int = 0  # links put back
    modes: int = 0  # modes put back on entries otherwise unchanged
    bytes: int = 0
    kept: list[tuple[str, str]] = field(default_factory=list)  # left as they are, and why
    excluded: list[tuple[str, str]] = field(default_factory=list)
    setuid_dropped: list[str] = field(default_factory=list)
    seconds: float = 0.0


def summarize(paths: list[tuple[str, str]], most: int = 5) -> str:
    """`a (why), b (why) and 3 more`."""
    shown = ", ".join(f"{path} ({why})" for path, why in paths[:most])
    return shown + (f" and {len(paths) - most} more" if len(paths) > most else "")
