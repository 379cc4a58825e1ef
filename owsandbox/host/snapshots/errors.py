"""What goes wrong with snapshots, as the errors the store raises: each message says why."""

from __future__ import annotations


class SnapshotError(Exception):
    """A snapshot could not be saved, restored, listed or dropped; the message says why."""


class SnapshotTooLarge(SnapshotError):
    """A save would take the store past its limit; nothing of it was kept."""


class StoreTampered(SnapshotError):
    """Something in the snapshot store is not what the host made (a link, a file of another kind)."""


class WorkspaceChanged(SnapshotError):
    """What a restore met in the workspace is not what it listed a moment before (a link, say)."""
