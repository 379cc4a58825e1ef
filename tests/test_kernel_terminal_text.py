"""`TerminalText`: what a notebook can show of a terminal's output (colours, \\r, \\n, \\t, \\b), with the
cursor movement, erasing, titles and other sequences dropped, whatever way the text is cut into chunks.
Pure: no kernel, no sandbox."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from owsandbox.kernel.cell.terminal_text import TerminalText, plain

from .fuzz_budget import examples

pytestmark = pytest.mark.unit

FUZZ = settings(max_examples=examples(400), deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SGR = re.compile(r"\x1b\[[0-9;:]*m")


def reduce(*chunks: str) -> str:
    text_filter = TerminalText()
    return "".join(text_filter.feed(chunk) for chunk in chunks)


def test_colours_and_the_controls_jupyter_handles_pass_through():
    text = "\x1b[1;31mred\x1b[0m plain\tx\b\rover\n\x1b[38;5;208mo\x1b[38:2:1:2:3mt\x1b[m"
    assert reduce(text) == text


def test_cursor_movement_erasing_and_modes_are_dropped():
    assert reduce("a\x1b[Kb\x1b[2Jc\x1b[?25ld\x1b[?25he\x1b[10;5Hf\x1b[3Ag\x1b[1Gh\x1b[?2004hi") == "abcdefghi"
    assert reduce("x\x1b[>4;2my\x1b[?1m") == "xy"  # private marks: not colours, whatever the final


def test_titles_strings_and_two_character_escapes_are_dropped_and_a_link_keeps_its_text():
    assert reduce("\x1b]0;my title\x07after") == "after"
    assert reduce("\x1b]2;title\x1b\\after") == "after"
    assert reduce("see \x1b]8;id=1;https://example.org\x1b\\the docs\x1b]8;;\x1b\\ now") == "see the docs now"
    assert reduce("\x1bPq#0;2;0;0;0#1~~\x1b\\done") == "done"  # DCS (sixel)
    assert reduce("\x1b(Ba\x1b)0b\x1b7c\x1b8d\x1b=e\x1b>f\x1bMg\x1bch") == "abcdefgh"


def test_other_control_characters_are_dropped():
    assert reduce("a\x07b\x00c\x0bd\x0ce\x7ff\x85g\x1f") == "abcdefg"
    assert reduce("\x9b31mred\x9b0m \x9d0;t\x9cz") == "\x1b[31mred\x1b[0m z"  # C1 forms


def test_a_sequence_split_anywhere_is_put_together_and_never_shown_in_part():
    text = "a\x1b[1;31mred\x1b[0m\x1b[2K\r\x1b]8;;http://x\x1b\\link\x1b]8;;\x07\x1b[?25lz"
    whole = reduce(text)
    assert whole == "a\x1b[1;31mred\x1b[0m\rlinkz"
    for cut in range(len(text) + 1):
        text_filter = TerminalText()
        first, second = text_filter.feed(text[:cut]), text_filter.feed(text[cut:])
        assert first + second == whole, cut
        assert SGR.sub("", first).find("\x1b") < 0, (cut, first)
    text_filter = TerminalText()
    assert "".join(text_filter.feed(char) for char in text) == whole


def test_a_broken_sequence_is_dropped_and_what_follows_shows():
    assert reduce("a\x1b[12\nb") == "a\nb"  # a line break ends a CSI that never finished
    assert reduce("a\x1b]0;no end\nb") == "a\nb"  # and an OSC (a title has no line break)
    assert reduce("a\x1b\x1b[31mb") == "a\x1b[31mb"
    endless = reduce("a\x1b[" + "1;" * 100 + "mb")  # past any real sequence's length: text again
    assert endless.startswith("a") and endless.endswith(";mb") and "\x1b" not in endless


def test_an_unfinished_sequence_at_the_end_is_dropped():
    text_filter = TerminalText()
    assert text_filter.feed("done\x1b[3") == "done"
    assert text_filter.pending
    assert text_filter.end() == ""
    assert not text_filter.pending
    assert text_filter.feed("1mx") == "1mx"  # a new stream: the old half sequence is gone


def test_plain_keeps_only_the_words_of_a_prompt():
    assert plain("\x1b[1;32mName?\x1b[0m ") == "Name? "
    assert plain("\x1b]0;t\x07pw: \x1b[K") == "pw: "


escape_heavy = st.text(st.sampled_from(list("\x1b[]();?>0123456789mKHJPX^_\\\x07\x9b\x9c\x9d\n\r\tab ")),
                       max_size=80)


@FUZZ
@given(escape_heavy, st.lists(st.integers(0, 80), max_size=8))
def test_any_text_cut_anywhere_gives_the_same_result_and_no_part_of_a_sequence(text, cuts):
    whole = reduce(text)
    bounds = [0, *sorted(min(c, len(text)) for c in cuts), len(text)]
    text_filter = TerminalText()
    pieces = [text_filter.feed(text[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]
    assert "".join(pieces) == whole
    for piece in pieces:
        rest = SGR.sub("", piece)
        assert "\x1b" not in rest and not re.search("[\x00-\x07\x0b\x0c\x0e-\x1f\x7f-\x9f]", rest), piece


@FUZZ
@given(st.text(max_size=200))
def test_any_unicode_text_never_raises_and_plain_text_is_untouched(text):
    out = reduce(text)
    assert "\x1b" not in SGR.sub("", out)
    if not re.search("[\x00-\x07\x0b\x0c\x0e-\x1f\x7f-\x9f]", text):
        assert out == text
