"""The sans-I/O decoder: execd frames in, JSON records with resume offsets out.

Each test pins one property the channel's users rely on: a record is cut at the LF byte only, a
record split across frames is delivered once and whole, offsets count every output byte (stderr
too, as execd's counter does), a lost replay window is loud, and bad input raises only the
documented errors. The property tests at the end check the same over generated streams.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from owsandbox.channel.errors import BadFrame, BadRecord, JsonLineError, LineTooLong, ReplayGap
from owsandbox.channel.jsonlines import (
    REPLAY,
    STDERR,
    STDERR_ADVICE,
    STDOUT,
    Event,
    JsonLineDecoder,
    Record,
    StderrText,
)

from .fuzz_budget import examples

# A hang guard: a property's full budget took 131 s under two test runs at once (85 s in another), and a
# timeout raised inside it is replayed by hypothesis as a flaky failure rather than named.
PROPERTY_TIMEOUT = 600

pytestmark = pytest.mark.unit


def out(data: bytes) -> bytes:
    return bytes([STDOUT]) + data


def err(data: bytes) -> bytes:
    return bytes([STDERR]) + data


def replay(offset: int, data: bytes) -> bytes:
    return bytes([REPLAY]) + offset.to_bytes(8, "big") + data


def line(value: dict[str, Any]) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode("utf-8") + b"\n"


def records(events: list[Event]) -> list[tuple[dict[str, Any], int]]:
    return [(event.value, event.offset) for event in events if isinstance(event, Record)]


def texts(events: list[Event]) -> str:
    return "".join(event.text for event in events if isinstance(event, StderrText))


def feed_all(decoder: JsonLineDecoder, frames: list[bytes]) -> list[Event]:
    events: list[Event] = []
    for frame in frames:
        events += decoder.feed(frame)
    return events


# ── records and where they end ─────────────────────────────────────────────────────────────────


def test_unicode_line_separators_inside_a_string_do_not_end_the_record() -> None:
    value = {"text": "one\u2028two\u2029three", "next": "\u0085nel"}
    encoded = line(value)
    assert b"\xe2\x80\xa8" in encoded and b"\xe2\x80\xa9" in encoded  # raw, not escaped

    assert records(JsonLineDecoder().feed(out(encoded))) == [(value, len(encoded))]


def test_a_record_cut_anywhere_across_two_frames_arrives_once_and_whole() -> None:
    stream = line({"first": "é" * 3}) + line({"second": [1, 2, 3]})
    expected = records(JsonLineDecoder().feed(out(stream)))
    assert len(expected) == 2
    for cut in range(1, len(stream)):
        decoder = JsonLineDecoder()
        got = records(decoder.feed(out(stream[:cut])))
        assert all(offset <= cut for _, offset in got)
        got += records(decoder.feed(out(stream[cut:])))
        assert got == expected, f"cut at {cut}"


def test_the_offset_of_a_record_is_just_past_its_own_lf() -> None:
    first, second = line({"n": 1}), line({"n": 2})
    events = JsonLineDecoder().feed(out(first + second))
    assert [offset for _, offset in records(events)] == [len(first), len(first) + len(second)]


def test_offsets_count_the_bytes_written_to_stderr_too() -> None:
    first, warning, second = line({"n": 1}), b"warning: slow\n", line({"n": 2})
    decoder = JsonLineDecoder()
    events = feed_all(decoder, [out(first), err(warning), out(second)])

    assert records(events) == [({"n": 1}, len(first)), ({"n": 2}, len(first) + len(warning) + len(second))]
    assert texts(events) == "warning: slow\n"
    assert decoder.position == decoder.resume_offset == len(first) + len(warning) + len(second)


def test_blank_and_whitespace_lines_are_skipped_but_counted() -> None:
    stream = b"\n   \n\t\r\n" + line({"n": 1})
    assert records(JsonLineDecoder().feed(out(stream))) == [({"n": 1}, len(stream))]


def test_crlf_terminated_records_parse() -> None:
    assert records(JsonLineDecoder().feed(out(b'{"n": 1}\r\n'))) == [({"n": 1}, 10)]


def test_a_decoder_resuming_at_since_counts_from_there() -> None:
    decoder = JsonLineDecoder(since=500)
    assert decoder.position == decoder.resume_offset == 500
    assert records(decoder.feed(out(b'{"n": 1}\n'))) == [({"n": 1}, 509)]


# ── replay ─────────────────────────────────────────────────────────────────────────────────────


def test_a_replay_starting_after_the_requested_offset_is_a_loud_gap() -> None:
    decoder = JsonLineDecoder(since=100)
    with pytest.raises(ReplayGap, match="requested=100 available=140") as caught:
        decoder.feed(replay(140, line({"n": 1})))
    assert (caught.value.requested, caught.value.available) == (100, 140)


def test_a_replay_at_or_before_the_requested_offset_rebases_the_offsets() -> None:
    for start in (100, 80):
        decoder = JsonLineDecoder(since=100)
        encoded = line({"n": 1})
        assert records(decoder.feed(replay(start, encoded))) == [({"n": 1}, start + len(encoded))]


def test_live_frames_after_a_replay_continue_its_offsets() -> None:
    decoder = JsonLineDecoder(since=1000)
    head = line({"n": 1}) + b'{"n":'
    events = feed_all(decoder, [replay(1000, head), out(b" 2}\n"), err(b"x\n"), out(line({"n": 3}))])
    assert records(events) == [({"n": 1}, 1009), ({"n": 2}, 1018), ({"n": 3}, 1029)]


def test_a_replayed_line_that_is_not_a_record_is_stderr_text_not_an_error() -> None:
    decoder = JsonLineDecoder(since=0)
    mixed = line({"n": 1}) + b"warning: from stderr\n" + b"[1, 2]\n" + line({"n": 2})
    events = decoder.feed(replay(0, mixed))
    assert [value for value, _ in records(events)] == [{"n": 1}, {"n": 2}]
    assert texts(events) == "warning: from stderr\n[1, 2]\n"
    assert "warning: from stderr" in decoder.stderr_tail


def test_a_line_begun_in_the_replay_and_ended_live_is_judged_like_replayed_bytes() -> None:
    decoder = JsonLineDecoder(since=0)
    events = feed_all(decoder, [replay(0, b"progress 10%"), out(b" done\n"), out(line({"n": 1}))])
    assert texts(events) == "progress 10% done\n"
    assert [value for value, _ in records(events)] == [{"n": 1}]


def test_a_replay_ending_inside_a_stderr_line_does_not_swallow_the_next_live_record() -> None:
    decoder = JsonLineDecoder(since=0)
    # the replay stops after "warn" of stderr's "warn\n"; its LF and the next record arrive live
    events = feed_all(decoder, [replay(0, line({"n": 1}) + b"warn"), err(b"\n"), out(line({"n": 2}))])
    assert records(events) == [({"n": 1}, 9), ({"n": 2}, 9 + 5 + 9)]
    assert "warn" in texts(events)


def test_a_second_replay_that_continues_the_first_keeps_the_unfinished_line() -> None:
    decoder = JsonLineDecoder(since=0)
    events = feed_all(decoder, [replay(0, b'{"n":'), replay(5, b' 1}\n')])
    assert records(events) == [({"n": 1}, 9)]


def test_the_stderr_advice_says_to_keep_stderr_apart() -> None:
    assert "2>file" in STDERR_ADVICE


# ── what fails, and how ────────────────────────────────────────────────────────────────────────


def test_live_stdout_that_is_not_json_fails_naming_the_offset_past_the_line() -> None:
    with pytest.raises(BadRecord, match="non-JSON stdout at offset 6") as caught:
        JsonLineDecoder().feed(out(b"oops!\n"))
    assert (caught.value.start, caught.value.end, caught.value.line) == (0, 6, b"oops!")


def test_json_that_is_not_an_object_fails() -> None:
    decoder = JsonLineDecoder()
    decoder.feed(out(line({"n": 1})))
    with pytest.raises(BadRecord, match="JSON record is not an object at offset 19"):
        decoder.feed(out(b"[1, 2, 3]\n"))


@pytest.mark.parametrize("bad", [b"\xff\xfe{}", b'{"a": "\xc3"}', b"[" * 100_000, b"1" * 5000, b"{'single': 1}"])
def test_undecodable_or_unparsable_stdout_is_a_bad_record(bad: bytes) -> None:
    with pytest.raises(BadRecord):
        JsonLineDecoder().feed(out(bad + b"\n"))


def test_the_records_before_a_bad_line_are_still_delivered_one_by_one() -> None:
    decoder = JsonLineDecoder()
    decoder.push(out(line({"n": 1}) + b"garbage\n" + line({"n": 2})))
    assert decoder.next_event() == Record({"n": 1}, 9)
    with pytest.raises(BadRecord):
        decoder.next_event()


def test_an_error_sticks_until_reset() -> None:
    decoder = JsonLineDecoder()
    with pytest.raises(BadRecord):
        decoder.feed(out(b"nope\n"))
    with pytest.raises(BadRecord):
        decoder.feed(out(line({"n": 1})))
    decoder.reset(0)
    assert records(decoder.feed(out(line({"n": 1})))) == [({"n": 1}, 9)]


@pytest.mark.parametrize("frame", [b"", b"\x00stdin?", b"\x07", b"\x03\x00\x00\x00"])
def test_frames_execd_never_sends_to_a_client_are_bad_frames(frame: bytes) -> None:
    with pytest.raises(BadFrame):
        JsonLineDecoder().feed(frame)


def test_a_line_longer_than_the_limit_fails_naming_where_it_starts() -> None:
    decoder = JsonLineDecoder(max_line_bytes=64)
    decoder.feed(out(line({"n": 1})))
    decoder.feed(out(b'{"big": "' + b"x" * 40))
    with pytest.raises(LineTooLong, match="starting at offset 9 is longer than 64 bytes"):
        decoder.feed(out(b"x" * 40))


def test_a_long_line_in_one_frame_fails_the_same_way() -> None:
    with pytest.raises(LineTooLong, match="starting at offset 0"):
        JsonLineDecoder(max_line_bytes=64).feed(out(b'{"big": "' + b"x" * 100 + b'"}\n'))


def test_the_unfinished_line_held_in_memory_never_exceeds_the_limit() -> None:
    decoder = JsonLineDecoder(max_line_bytes=1000)
    with pytest.raises(LineTooLong):
        for _ in range(100):
            decoder.feed(out(b"y" * 99))
    assert len(decoder._partial) <= 1000


# ── stderr ─────────────────────────────────────────────────────────────────────────────────────


def test_stderr_is_kept_as_a_tail_and_never_becomes_a_record() -> None:
    decoder = JsonLineDecoder()
    events = decoder.feed(err(b'{"looks": "like a record"}\n'))
    assert records(events) == []
    assert decoder.stderr_tail == '{"looks": "like a record"}\n'


def test_the_stderr_tail_keeps_the_last_8_kib() -> None:
    decoder = JsonLineDecoder()
    for index in range(100):
        decoder.feed(err(f"line {index:03d} ".encode() + b"." * 190 + b"\n"))
    tail = decoder.stderr_tail
    assert len(tail.encode()) <= 8 * 1024
    assert tail.endswith("line 099 " + "." * 190 + "\n")
    assert "line 000" not in tail


def test_a_character_split_across_stderr_frames_is_decoded_whole() -> None:
    decoder = JsonLineDecoder()
    encoded = "naïve – ✓\n".encode()
    events = feed_all(decoder, [err(encoded[:3]), err(encoded[3:12]), err(encoded[12:])])
    assert texts(events) == "naïve – ✓\n"
    assert decoder.stderr_tail == "naïve – ✓\n"


def test_a_tail_cut_inside_a_character_shows_no_broken_start() -> None:
    decoder = JsonLineDecoder(stderr_tail_bytes=5)
    decoder.feed(err("ab✓✓".encode()))  # the bound keeps 2 of ✓'s 3 bytes, then ✓
    assert decoder.stderr_tail == "✓"


def test_reset_for_a_new_connection_keeps_the_stderr_tail() -> None:
    decoder = JsonLineDecoder()
    decoder.feed(err(b"boom\n"))
    decoder.reset(5)
    assert decoder.stderr_tail == "boom\n"
    assert decoder.position == 5


# ── resuming ───────────────────────────────────────────────────────────────────────────────────


def test_the_resume_offset_stops_at_an_unfinished_line_even_when_stderr_follows() -> None:
    decoder = JsonLineDecoder()
    decoder.feed(out(line({"n": 1}) + b'{"n": 2'))
    assert decoder.resume_offset == 9
    decoder.feed(err(b"note\n"))
    assert (decoder.resume_offset, decoder.position) == (9, 21)
    decoder.feed(out(b"}\n"))
    assert decoder.resume_offset == decoder.position == 23


def test_lenient_stdout_turns_terminal_chatter_into_text() -> None:
    decoder = JsonLineDecoder(lenient_stdout=True)
    events = decoder.feed(out(b"$ stty -echo\r\n" + line({"n": 1})))
    assert texts(events) == "$ stty -echo\r\n"
    assert [value for value, _ in records(events)] == [{"n": 1}]


# ── properties over generated streams ──────────────────────────────────────────────────────────

_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | _text
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
                       max_leaves=8)
_objects = st.dictionaries(_text, _values, max_size=4)
# stderr lines that can never be taken for a JSON object, even when replayed
_stderr_lines = _text.map(lambda text: ("E" + text.replace("\n", " ").replace("\r", " ") + "\n").encode("utf-8"))


@st.composite
def _streams(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[tuple[int, bytes]]]:
    """Records and the frames a program would produce for them, stderr interleaved anywhere."""
    values = draw(st.lists(_objects, max_size=8))
    stdout = b"".join(line(value) + draw(st.sampled_from([b"", b"\n", b" \n"])) for value in values)
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(stdout) - 1)), max_size=6))) if stdout else []
    frames: list[tuple[int, bytes]] = []
    last = 0
    for cut in [*cuts, len(stdout)]:
        if cut > last:
            frames.append((STDOUT, stdout[last:cut]))
            last = cut
        if draw(st.booleans()):
            frames.append((STDERR, draw(st.binary(min_size=1, max_size=20))))
    return values, frames


def _split(draw: st.DrawFn, frames: list[tuple[int, bytes]]) -> list[bytes]:
    split: list[bytes] = []
    for kind, data in frames:
        points = sorted(draw(st.sets(st.integers(1, max(1, len(data) - 1)), max_size=4))) if len(data) > 1 else []
        for start, end in zip([0, *points], [*points, len(data)], strict=True):
            split.append(bytes([kind]) + data[start:end])
    return split


@pytest.mark.timeout(PROPERTY_TIMEOUT)
@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=_streams(), data=st.data())
def test_any_split_into_frames_yields_the_same_records_offsets_and_stderr(stream: Any, data: st.DataObject) -> None:
    values, frames = stream
    whole = JsonLineDecoder()
    expected = feed_all(whole, [bytes([kind]) + chunk for kind, chunk in frames])
    assert [value for value, _ in records(expected)] == values
    total = sum(len(chunk) for _, chunk in frames)
    assert whole.position == whole.resume_offset == total

    pieces = JsonLineDecoder()
    got = feed_all(pieces, _split(data.draw, frames))
    assert records(got) == records(expected)
    assert texts(got) == texts(expected)
    assert pieces.position == total


@pytest.mark.timeout(PROPERTY_TIMEOUT)
@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(_objects, min_size=1, max_size=6), noise=st.lists(st.lists(_stderr_lines, max_size=2),
       min_size=6, max_size=6), data=st.data())
def test_resuming_from_any_record_replays_exactly_the_records_after_it(
        values: list[dict[str, Any]], noise: list[list[bytes]], data: st.DataObject) -> None:
    # the program writes whole stderr lines between records: the case the docs promise is exact
    frames: list[tuple[int, bytes]] = []
    for value, warnings in zip(values, noise, strict=False):
        frames.append((STDOUT, line(value)))
        frames += [(STDERR, warning) for warning in warnings]
    ring = b"".join(chunk for _, chunk in frames)
    live = records(feed_all(JsonLineDecoder(), [bytes([kind]) + chunk for kind, chunk in frames]))

    index = data.draw(st.integers(0, len(live)), label="resume after this many records")
    since = live[index - 1][1] if index else 0
    replayed_to = data.draw(st.integers(since, len(ring)), label="replay ends here")
    resumed = JsonLineDecoder(since=since)
    frames_after = [replay(since, ring[since:replayed_to])] if replayed_to > since else []
    position = 0
    for kind, chunk in frames:  # the rest arrives live, each byte with its true stream
        start, end = max(position, replayed_to), position + len(chunk)
        if end > start:
            frames_after.append(bytes([kind]) + chunk[start - position:])
        position = end
    assert records(feed_all(resumed, frames_after)) == live[index:]


@pytest.mark.timeout(PROPERTY_TIMEOUT)
@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(since=st.integers(0, 300), frames=st.lists(st.tuples(st.integers(0, 5), st.binary(max_size=40) |
       st.lists(st.sampled_from([b"{", b"}", b'"', b"\n", b":", b"1", b"[", b" ", b"\xe2\x80\xa8", b"a"]),
                max_size=30).map(b"".join)), max_size=12), offsets=st.lists(st.integers(0, 400), max_size=12))
def test_garbage_raises_only_the_documented_errors(since: int, frames: list[tuple[int, bytes]],
                                                   offsets: list[int]) -> None:
    decoder = JsonLineDecoder(since=since, max_line_bytes=48)
    try:
        for index, (kind, payload) in enumerate(frames):
            if kind == REPLAY and index < len(offsets):
                frame = replay(offsets[index], payload)
            else:
                frame = bytes([kind]) + payload if kind < 5 else payload  # kind 5: raw bytes, maybe empty
            for event in decoder.feed(frame):
                assert isinstance(event, Record | StderrText)
                if isinstance(event, Record):
                    assert isinstance(event.value, dict)
            assert 0 <= decoder.resume_offset <= decoder.position
            assert len(decoder._partial) <= 48
    except JsonLineError:
        pass
