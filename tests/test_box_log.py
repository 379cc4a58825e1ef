"""The daemon's log lines (box/log.py) are the lines `logging` wrote with the daemon's format, and box code
in a process that did not configure them (the direct provider's shells, in the kernel) logs through
`logging` as before."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from owsandbox.box import log as boxlog

pytestmark = pytest.mark.unit


def by_logging(name: str, level: int, message: str, args: tuple[object, ...], created: float,
               exc_info: object = None) -> str:
    record = logging.LogRecord(name, level, __file__, 1, message, args, exc_info)  # type: ignore[arg-type]
    record.created, record.msecs = created, int((created - int(created)) * 1000) + 0.0
    return logging.Formatter(boxlog.FORMAT).format(record)


@pytest.mark.parametrize("created", [1767322245.678, 1767322245.0, 1767322245.9999, 0.5])
@pytest.mark.parametrize("level", [10, 20, 30, 40])
def test_a_line_is_what_logging_writes_with_the_daemons_format(created, level):
    name = "owsandbox.box.shell.registry"
    assert boxlog.line(name, level, "shell main (pid 7) exited", created) == \
        by_logging(name, level, "shell %s (pid %d) exited", ("main", 7), created)


@pytest.fixture
def configured():
    boxlog.configure("info")
    try:
        yield
    finally:
        boxlog.unconfigure()


def test_the_configured_daemon_writes_from_its_level_up_with_the_traceback_of_an_exception(configured, capsys):
    log = boxlog.getLogger("owsandbox.box.dispatch")
    log.debug("not %s", "shown")
    log.info("request %s (%s) done", 3, "shell.run")
    try:
        raise ValueError("I/O operation on closed file.")
    except ValueError:
        log.exception("request %s failed", 4)
        expected = by_logging("x", 40, "m", (), 0.0, sys.exc_info()).split("\n", 1)[1]
    lines = capsys.readouterr().err.split("\n")
    assert lines[0].endswith(" [owbox INFO owsandbox.box.dispatch] request 3 (shell.run) done")
    assert lines[1].endswith(" [owbox ERROR owsandbox.box.dispatch] request 4 failed")
    assert "\n".join(lines[2:]) == expected + "\n"
    assert lines[2] == "Traceback (most recent call last):" and lines[-2] == "ValueError: I/O operation on closed file."


def test_a_message_that_cannot_be_formatted_is_said_so_and_a_line_not_written_dropped(configured, capsys,
                                                                                        monkeypatch):
    log = boxlog.getLogger("owsandbox.box.server")
    log.warning("%d connections", "two")  # a wrong argument: said so, and the daemon goes on
    assert capsys.readouterr().err.endswith(" [owbox WARNING owsandbox.box.server] --- Logging error --- TypeError: "
                                            "%d format: a real number is required, not str; message '%d connections', "
                                            "arguments ('two',)\n")
    closed = io.StringIO()
    closed.close()
    with monkeypatch.context() as patched:
        patched.setattr(sys, "stderr", closed)
        log.warning("after the log's end")  # no exception reaches the daemon


def test_unconfigured_it_logs_through_logging_naming_the_caller(caplog):
    with caplog.at_level(logging.DEBUG, logger="owsandbox.box.shell.registry"):
        boxlog.getLogger("owsandbox.box.shell.registry").info("shell %s exited", "main")
    [record] = caplog.records
    assert (record.name, record.levelno, record.getMessage()) == ("owsandbox.box.shell.registry", 20,
                                                                  "shell main exited")
    assert record.pathname == __file__
    assert record.funcName == "test_unconfigured_it_logs_through_logging_naming_the_caller"


def test_the_levels_are_those_the_command_line_offers():
    from owsandbox.box.cli import LOG_LEVELS

    assert {name.lower() for name in boxlog.LEVELS} == set(LOG_LEVELS)
    assert all(logging.getLevelName(name) == number for name, number in boxlog.LEVELS.items())
