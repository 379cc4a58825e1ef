"""owsandbox's own logs: quiet by default, `OWSANDBOX_LOG=debug` (or `info`) to see what it does.

Every module logs to `logging.getLogger(__name__)`, under `owsandbox`. On the host (the kernel, the
runner client, `%attach`, completion) they go to the process's stderr: for a kernel, the terminal
that started JupyterLab or `jupyter console`'s log; warnings show without asking. In the box, the
daemon writes its log to `daemon.log` in its state folder (named by `%sandbox`); the provider hands
it the same level, since a sandbox's environment is cleared.
"""

from __future__ import annotations

import logging
import sys

from . import settings

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def level_name(given: settings.Settings | None = None) -> str:
    """The level asked for in `OWSANDBOX_LOG`, lower case; `warning` when unset or not a level."""
    name = settings.settings_of(given).log.lower()
    return name if name in LEVELS else "warning"


def log_level_args(given: settings.Settings | None = None) -> list[str]:
    """Called by providers as they build the daemon's `serve` arguments: the box's log level, which
    cannot come through the sandbox's cleared environment ([] at the default)."""
    name = level_name(given)
    return [] if name == "warning" else ["--log-level", name]


def configure() -> None:
    """Called once by a program's entry point (the kernel, the `owsandbox` command): the `owsandbox`
    loggers at the asked level, on stderr, whatever the host application did to the root logger."""
    logger = logging.getLogger("owsandbox")
    logger.setLevel(LEVELS[level_name()])
    if not any(getattr(handler, "_owsandbox", False) for handler in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[owsandbox %(levelname)s %(name)s] %(message)s"))
        handler._owsandbox = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
        logger.propagate = False
