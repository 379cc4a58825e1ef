"""The isolation policy every isolating provider applies the same way: bubblewrap, a container and
an OpenSandbox sandbox.

Which settings turn the network and the limits on or off, which of the host's variables a box may
see (the few a shell needs, and those named on purpose with `OWSANDBOX_ENV`), and which folders can
never be a box's writable workspace. Each provider enforces it with its own means; this module only
says what it is, so that a change here changes all of them.
"""

from __future__ import annotations

from collections.abc import Callable

from ... import settings
from ...protocol.paths import inside

#: The host's variables a box sees without being told: what a shell and its programs need to run.
ALLOWED_ENV = ("PATH", "LANG", "LANGUAGE", "TZ", "TERM", "COLORTERM", "USER", "LOGNAME")
#: Folders that are never a workspace: writable, they would hand the box the system itself.
SYSTEM_FOLDERS = ("/", "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/proc", "/sys", "/dev", "/boot", "/run",
                  "/var")


def passed_env_names(given: settings.Settings | None = None) -> list[str]:
    """The names the kernelspec or the user pass into the box on purpose (`OWSANDBOX_ENV=A,B`)."""
    return list(settings.settings_of(given).env)


class WorkspaceRefused(ValueError):
    """The workspace folder cannot be a sandbox's writable folder; the message says why."""


def refuse_workspace(folder: str, private: str | Callable[[], str], private_is: str) -> None:
    """WorkspaceRefused when `folder` may not be a box's writable workspace: a system folder (a box
    that may write there isolates nothing), or one holding `private`, this machine's private folder
    for its boxes (`private_is` says what it holds and what a box that wrote there could do). `private`
    may be a function that finds it: it is asked only for a folder that is not a system folder (finding
    one outside `/` fails, and that error would hide this one)."""
    if folder in SYSTEM_FOLDERS:
        raise WorkspaceRefused(
            f"the workspace cannot be {folder}: a sandbox that may write there isolates nothing. Open the "
            "notebook from a project folder, or set OWSANDBOX_WORKSPACE to one")
    if callable(private):
        private = private()
    if inside(private, folder):
        raise WorkspaceRefused(
            f"the workspace {folder} holds {private}, {private_is}. Open the notebook from a project folder, "
            "or set OWSANDBOX_WORKSPACE to one")
