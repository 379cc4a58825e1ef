"""The box's command line: `quick_parse` (no imports, for the command lines the providers write) reads
every command line it takes exactly as argparse does, and leaves every other one to argparse."""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from owsandbox.box.cli import COMMANDS, build_parser, quick_parse

from .fuzz_budget import examples

FUZZ = settings(max_examples=examples(600), deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])


def by_argparse(argv: list[str]) -> dict[str, object] | None:
    """argparse's reading of `argv`, or None where it refuses it (it exits after its usage)."""
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        try:
            return vars(build_parser().parse_args(argv))
        except SystemExit:
            return None


#: What the providers and the daemon's starters write (local.py, boxed.py, bwrap.py, daemonctl.py, exec.py).
WRITTEN = [
    ["attach", "--socket", "/tmp/s/run/runner.sock", "--silence-seconds", "60.0"],
    ["attach", "--socket", "/run/owsandbox/run/runner.sock", "--silence-seconds", "60", "--start", "--cwd",
     "/home/u/work", "--linger", "300", "--log-level", "info"],
    ["attach", "--socket", "/s", "--start"],
    ["forward", "--socket", "/run/owsandbox/run/execd.sock"],
    ["serve", "--socket", "/run/owsandbox/run/runner.sock", "--listen-fd", "3", "--execd-fd", "4", "--end-namespace",
     "--cwd", "/home/u/work", "--exit-with-parent", "--log-level", "debug"],
    ["serve", "--socket", "/s", "--cwd", "/w", "--linger", "300", "--log-dir", "/l", "--max-frame-bytes", "1048576",
     "--output-limit", "100"],
    ["serve", "--socket", "", "--cwd", ""],
]


@pytest.mark.unit
@pytest.mark.parametrize("argv", WRITTEN, ids=lambda argv: " ".join(argv)[:60])
def test_what_the_providers_write_is_read_without_argparse_as_argparse_reads_it(argv):
    quick = quick_parse(argv)
    assert quick is not None
    assert vars(quick) == by_argparse(argv)


@pytest.mark.unit
@pytest.mark.parametrize("argv", [
    [], ["--help"], ["serve", "--help"], ["attach"], ["serve", "--cwd", "/w"], ["attach", "--socket"],
    ["attach", "--socket", "-x"], ["attach", "--socket=/s"], ["attach", "--sock", "/s"],
    ["attach", "--socket", "/a", "--socket", "/b"], ["serve", "--socket", "/s", "--linger", "soon"],
    ["serve", "--socket", "/s", "--log-level", "DEBUG"], ["serve", "--socket", "/s", "--linger", "-1"],
    ["serve", "--socket", "/s", "--exit-with-parent", "--exit-with-parent"], ["forward", "--socket", "/s", "x"],
    ["attach", "--start", "--socket", "/s"], ["run", "--socket", "/s"], ["serve", "--socket", "/s", "--"],
], ids=lambda argv: " ".join(argv) or "(none)")
def test_anything_else_is_left_to_argparse(argv):
    assert quick_parse(argv) is None


_TOKENS = st.sampled_from(sorted({name for _about, options in COMMANDS.values() for name, *_ in options}
                                 | {"3", "-1", "0.5", "inf", "x", "", "debug", "DEBUG", "--", "-h", "--sock", "1e3",
                                    "/s", "--socket=/s", "nan", "1_0"}))


@pytest.mark.unit
@FUZZ
@given(command=st.sampled_from([*COMMANDS, "other"]), rest=st.lists(_TOKENS, max_size=10))
def test_any_command_line_quick_parse_takes_it_reads_as_argparse_does(command, rest):
    argv = [command, *rest]
    quick = quick_parse(argv)
    if quick is not None:
        assert vars(quick) == by_argparse(argv), argv


@pytest.mark.unit
def test_the_help_names_every_command_and_option():
    text = build_parser().format_help()
    assert all(command in text for command in COMMANDS)
    for command, (_about, options) in COMMANDS.items():
        helped = build_parser()._subparsers._group_actions[0].choices[command].format_help()  # type: ignore[union-attr]
        assert all(name in helped for name, *_ in options), command
    assert isinstance(build_parser(), argparse.ArgumentParser)
