"""Bad input for every decoder and parser: no crash, only the documented errors, and round trips.

Property tests (hypothesis, derandomized: the same examples on every run, no example database) over
the sans-I/O cores, fed random and adversarial input:

* runner frames: `protocol.encode`/`decode`/`sniff_id`, `LineSplitter` (any split of a stream gives
  the same lines and over-long-line markers), the client's `SeqTracker`;
* the shell's output: `MarkerScanner` (bytes and text; any split gives the same events, and the events
  put back together are the stream), `StreamDecoder`, `LiveBatcher`, `OutputRecord`, and the kernel's
  `CellOutput` (live frames dropped anywhere, filled in from the record: exact text);
* execd frames: `wsframes.FrameParser` fed random bytes (masked or not: only `ProtocolError`), and
  encode → any split → parse; Close payloads;
* the JSON-lines channel's `JsonLineDecoder` fed random frames (only `JsonLineError`s), and real
  streams split anywhere with stderr frames between (exact records and offsets), and resumed;
* the magics: `parse_cell`, every magic's parser on random token lists (only `UsageError`), the
  `%send` helpers; the bash completeness check (one of its three answers, never an exception).

The errors each module documents: protocol.decode returns None for anything that is not a frame;
wsframes raises `ProtocolError`; jsonlines raises `JsonLineError` kinds (`BadFrame`, `BadRecord`,
`LineTooLong`, `ReplayGap`) and `ValueError` only for a negative `since`; magics raise `UsageError`;
completeness answers ("complete" | "incomplete" | "invalid", indent).

The tests at the end pin bugs these properties found (now fixed), a few through a real kernel.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from owsandbox import protocol as P
from owsandbox.box.execd import wsframes as W
from owsandbox.box.shell.capture import MARKER_START, LiveBatcher, MarkerScanner, OutputRecord, StreamDecoder
from owsandbox.box.shell.lines import DISPLAY_START
from owsandbox.channel.errors import JsonLineError, ReplayGap
from owsandbox.channel.jsonlines import REPLAY, STDERR, STDOUT, JsonLineDecoder, Record, StderrText
from owsandbox.host.session import SeqTracker
from owsandbox.kernel.cell.output import TAIL_CHARS, CellOutput, Display, Notice, Stream
from owsandbox.kernel.editing import completeness
from owsandbox.kernel.errors import UsageError
from owsandbox.kernel.magics.attach import _headers, _parse_records, _send_options
from owsandbox.kernel.magics.files import _span
from owsandbox.kernel.magics.framework import parse_cell
from owsandbox.kernel.magics.table import all_magics

from ..fuzz_budget import examples

FUZZ = settings(max_examples=examples(300), deadline=None, database=None, derandomize=True, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])
FEWER = settings(FUZZ, max_examples=examples(150))


# ── shared strategies ───────────────────────────────────────────────────────────────────────────

def splits(data: st.DataObject, length: int, label: str = "cuts") -> list[tuple[int, int]]:
    """A random partition of range(length) into consecutive (start, end) pieces, empty pieces included."""
    cuts = sorted(data.draw(st.lists(st.integers(0, length), max_size=12), label=label))
    bounds = [0, *cuts, length]
    return list(zip(bounds, bounds[1:], strict=False))


def pieces_of(blob: Any, parts: list[tuple[int, int]]) -> list[Any]:
    return [blob[a:b] for a, b in parts]


json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12)
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=5)

# Bytes that look like a newline-framed stream: short runs, newlines, and characters that matter.
stream_bytes = st.lists(st.one_of(st.binary(max_size=40), st.just(b"\n"), st.sampled_from(
    [b"{", b"}", b'"', b"\\", b"\r", b" ", b"\xff", b"\xe2\x80\xa8", b'{"id":1}', b"[1]"])), max_size=60
                        ).map(b"".join)


# ── runner frames ───────────────────────────────────────────────────────────────────────────────

@pytest.mark.unit
@FUZZ
@given(st.binary(max_size=300))
@example(b"\xff\xfe")
@example(b"[1,2]")
@example(b'{"a":' * 50)
def test_decode_gives_a_dict_or_none_for_any_line(line: bytes) -> None:
    value = P.decode(line)
    assert value is None or isinstance(value, dict)


@pytest.mark.unit
@FUZZ
@given(json_objects)
def test_encode_then_decode_is_the_identity(message: dict[str, Any]) -> None:
    frame = P.encode(message)
    assert frame.endswith(b"\n") and frame.count(b"\n") == 1 and frame.isascii()
    assert P.decode(frame[:-1]) == message


@pytest.mark.unit
@FUZZ
@given(st.one_of(st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40),
                 st.integers(-(10**17), 10**17)),
       st.sampled_from(["shell.run", "fs.read", "x"]), json_objects)
def test_sniff_id_finds_the_id_of_any_request_frame(request_id: Any, method: str, params: dict[str, Any]) -> None:
    frame = P.encode(P.request(request_id, method, params))
    assert P.sniff_id(frame[:512]) == request_id


@pytest.mark.unit
@FUZZ
@given(st.binary(max_size=600))
def test_sniff_id_never_raises(head: bytes) -> None:
    P.sniff_id(head)


@pytest.mark.unit
@FUZZ
@given(stream_bytes, st.integers(1, 80), st.data())
def test_the_line_splitter_gives_the_same_lines_for_any_split(data: bytes, max_line: int, draw) -> None:
    splitter = P.LineSplitter(max_line)
    out: list[Any] = []
    for piece in pieces_of(data, splits(draw, len(data))):
        out += splitter.feed(piece)
        assert splitter.buffered <= max_line
    *lines, rest = data.split(b"\n")
    assert len(out) == len(lines)
    for got, line in zip(out, lines, strict=True):
        if len(line) > max_line:
            assert isinstance(got, P.Oversize) and got.size == len(line)
            assert line.startswith(got.head) and min(len(line), max_line + 1, 512) <= len(got.head) <= 512
        else:
            assert got == line
    assert splitter.buffered == (len(rest) if len(rest) <= max_line else 0)


@pytest.mark.unit
@FUZZ
@given(st.lists(st.integers(1, 60), max_size=80), st.integers(0, 5))
def test_the_seq_tracker_counts_exactly_the_gapless_prefix(seqs: list[int], start: int) -> None:
    tracker = SeqTracker(start)
    seen: set[int] = set(range(1, start + 1))
    for seq in seqs:
        assert tracker.saw(seq) == (seq not in seen)
        seen.add(seq)
        contiguous = 0
        while contiguous + 1 in seen:
            contiguous += 1
        assert tracker.contiguous == contiguous


# ── the shell's output ──────────────────────────────────────────────────────────────────────────

def _scanner_reference(stream: Any, start: Any) -> list[tuple[str, Any]]:
    newline = "\n" if isinstance(stream, str) else b"\n"
    events: list[tuple[str, Any]] = []
    pos = 0
    while True:
        found = stream.find(start, pos)
        end = stream.find(newline, found) if found >= 0 else -1
        if found < 0 or end < 0:
            if stream[pos:]:
                events.append(("data", stream[pos:]))
            return events
        if found > pos:
            events.append(("data", stream[pos:found]))
        events.append(("marker", stream[found + len(start) : end]))
        pos = end + 1


def _merged(events: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for kind, payload in events:
        if kind == "data" and out and out[-1][0] == "data":
            out[-1] = ("data", out[-1][1] + payload)
        elif kind != "data" or payload:
            out.append((kind, payload))
    return out


def _scan(scanner: MarkerScanner, pieces: list[Any]) -> list[tuple[str, Any]]:
    events: list[tuple[str, Any]] = []
    for piece in pieces:
        events += scanner.feed(piece)
    events.append(("data", scanner.flush()))
    return _merged(events)


marker_bytes = st.lists(st.sampled_from(
    [b"\x1f", b"\x1e", b"\x1f\x1e", b"OWS:", b"OW", b"S:", b"\n", b"a", b"xyz", b"\xff", MARKER_START,
     MARKER_START + b"tok:0:/p\n", MARKER_START[:-1]]), max_size=50).map(b"".join)
marker_text = st.lists(st.sampled_from(
    ["\x1f", "\x1d", "\x1f\x1d", "OWD:", "O", "\n", "a", "é", "\t", DISPLAY_START, DISPLAY_START + "image/png\t\t/p\n",
     DISPLAY_START[:-2]]), max_size=50).map("".join)


@pytest.mark.unit
@FUZZ
@given(marker_bytes, st.data())
def test_the_marker_scanner_gives_the_same_events_for_any_split_of_bytes(stream: bytes, draw) -> None:
    events = _scan(MarkerScanner(), pieces_of(stream, splits(draw, len(stream))))
    assert events == _merged(_scanner_reference(stream, MARKER_START))


@pytest.mark.unit
@FUZZ
@given(marker_text, st.data())
def test_the_marker_scanner_gives_the_same_events_for_any_split_of_text(stream: str, draw) -> None:
    events = _scan(MarkerScanner(DISPLAY_START), pieces_of(stream, splits(draw, len(stream))))
    assert events == _merged(_scanner_reference(stream, DISPLAY_START))


@pytest.mark.unit
@FEWER
@given(st.integers(0, 40_000), st.binary(max_size=30), st.data())
def test_the_marker_scanner_loses_no_byte_of_an_unended_marker(filler: int, tail: bytes, draw) -> None:
    """A marker start with no newline for more than 16 KiB is let through; every byte is still there."""
    stream = b"a" + MARKER_START + b"b" * filler + tail.replace(b"\n", b"") + b"\nz"
    events = _scan(MarkerScanner(), pieces_of(stream, splits(draw, len(stream))))
    rebuilt = b"".join(p if kind == "data" else MARKER_START + p + b"\n" for kind, p in events)
    assert rebuilt == stream


@pytest.mark.unit
@FUZZ
@given(st.binary(max_size=200).map(lambda b: b + "é€😀".encode()[: len(b) % 9]), st.data())
def test_the_stream_decoder_agrees_with_a_one_shot_decode_for_any_split(data: bytes, draw) -> None:
    decoder = StreamDecoder()
    text = "".join(decoder.decode(piece) for piece in pieces_of(data, splits(draw, len(data))))
    assert text + decoder.decode(b"", final=True) == data.decode("utf-8", "replace")


batcher_ops = st.lists(st.one_of(
    st.tuples(st.just("add"), st.sampled_from(["stdout", "stderr"]), st.text(max_size=30),
              st.floats(0, 0.05)),
    st.tuples(st.just("due"), st.floats(0, 0.1)),
    st.tuples(st.just("flush"))), max_size=60)


@pytest.mark.unit
@FUZZ
@given(batcher_ops, st.integers(1, 100), st.integers(1, 6))
def test_the_live_batcher_loses_nothing_and_keeps_offsets(ops: list[tuple[Any, ...]], max_chars: int,
                                                          max_runs: int) -> None:
    batcher = LiveBatcher(delay=0.04, max_chars=max_chars, max_runs=max_runs)
    now, frames, added = 0.0, [], []
    for op in ops:
        if op[0] == "add":
            now += op[3]
            added.append((op[1], op[2]))
            batch = batcher.add(op[1], op[2], now)
        elif op[0] == "due":
            now += op[1]
            first = batcher.deadline()
            batch = batcher.due(now)
            assert bool(batch) == (first is not None and now >= first)
        else:
            batch = batcher.flush()
        assert all(a["stream"] != b["stream"] for a, b in zip(batch, batch[1:], strict=False))
        assert len(batch) <= max_runs
        frames += batch
        assert (batcher.deadline() is None) == (sum(len(t) for _, t in added) == sum(len(f["text"]) for f in frames))
    frames += batcher.flush()
    assert all(frame["text"] for frame in frames)
    offset = 0
    for frame in frames:
        assert frame["offset"] == offset
        offset += len(frame["text"])
    for stream in ("stdout", "stderr"):
        assert "".join(f["text"] for f in frames if f["stream"] == stream) == "".join(
            t for s, t in added if s == stream)


record_adds = st.lists(st.tuples(st.sampled_from(["stdout", "stderr"]),
                                 st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)), max_size=40)


@pytest.mark.unit
@FEWER
@given(record_adds, st.integers(2, 300))
def test_the_output_record_keeps_all_or_head_and_tail_and_logs_everything(adds: list[tuple[str, str]],
                                                                          limit: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "out.log")
        record = OutputRecord(limit, lambda: (path, open(path, "wb")))  # noqa: SIM115 - the record closes it
        for stream, text in adds:
            record.add(stream, text.encode(), text)
        output = record.finish()
        whole = "".join(text for _, text in adds)
        total = len(whole)
        assert record.total_chars == total and record.output_bytes == len(whole.encode())
        if total <= limit:
            assert not record.truncated and output == whole and record.log_path is None
            runs: list[list[Any]] = []
            for stream, text in adds:
                if text and runs and runs[-1][0] == stream:
                    runs[-1][1] += len(text)
                elif text:
                    runs.append([stream, len(text)])
            assert record.segments == runs
        else:
            half = limit // 2
            tail = min(half, total - half)
            omitted = total - half - tail
            said = f"{omitted} character{'' if omitted == 1 else 's'}"
            notice = f"\n[... {said} omitted; the whole output is in {path} ...]\n"
            assert record.truncated and record.segments is None and record.tail_chars == tail
            assert output == whole[:half] + notice + whole[total - tail :]
            assert Path(path).read_bytes() == whole.encode()


def _cell_run(adds: list[tuple[str, str]], keep: list[bool], limit: int) -> tuple[list[Any], str]:
    """The kernel's view of a command: live frames (some dropped) then the record."""
    batcher = LiveBatcher(delay=0.0, max_chars=25)
    record = OutputRecord(1 << 20, lambda: ("", open(os.devnull, "wb")))  # noqa: SIM115
    frames: list[dict[str, Any]] = []
    for i, (stream, text) in enumerate(adds):
        record.add(stream, text.encode(), text)
        frames += batcher.add(stream, text, float(i))
    view = CellOutput(limit)
    for frame, kept in zip(frames, keep + [True] * len(frames), strict=False):  # keep may be shorter
        if kept:
            view.live(frame)
    result = {"output": record.finish(), "truncated": record.truncated, "output_chars": record.total_chars}
    if record.truncated:
        result.update(log_path=record.log_path, tail_chars=record.tail_chars)
    if record.segments is not None:
        result["segments"] = record.segments
    view.finish(result)
    return view.take(), "".join(text for _, text in adds)


plain_adds = st.lists(st.tuples(st.sampled_from(["stdout", "stderr"]),
                                st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x1f"),
                                        max_size=40)), max_size=30)


@pytest.mark.unit
@FUZZ
@given(plain_adds, st.lists(st.booleans(), max_size=40))
def test_live_frames_dropped_anywhere_are_filled_in_from_the_record_exactly(adds, keep) -> None:
    events, _ = _cell_run(adds, keep, 4_000_000)
    assert all(isinstance(event, Stream) for event in events)
    for stream in ("stdout", "stderr"):
        assert "".join(e.text for e in events if e.name == stream) == "".join(t for s, t in adds if s == stream)


@pytest.mark.unit
@FUZZ
@given(plain_adds, st.lists(st.booleans(), max_size=40), st.integers(1, 200))
def test_past_the_cell_limit_exactly_the_first_characters_show_and_one_notice(adds, keep, limit) -> None:
    events, whole = _cell_run(adds, keep, limit)
    shown = "".join(e.text for e in events if isinstance(e, Stream))
    notices = [e for e in events if isinstance(e, Notice)]
    assert not any(isinstance(e, Display) for e in events)
    if len(whole) <= limit:
        assert shown == whole and not notices
    else:  # the record kept every character (no log): the end is shown after the notices, as for a cut output
        rest = len(whole) - limit
        assert shown == whole[:limit] + whole[len(whole) - min(rest, TAIL_CHARS) :]
        assert "output limit" in notices[0].text, notices
        said = (f"{rest} characters of this command's output were" if rest != 1
                else "1 character of this command's output was")
        assert f"{said} not shown" in notices[1].text, notices


# ── execd frames (RFC 6455) ─────────────────────────────────────────────────────────────────────

@st.composite
def frame_like(draw: Any) -> bytes:
    """One frame with random fields: mostly well-formed, sometimes not at all."""
    opcode = draw(st.sampled_from([0, 1, 2, 8, 9, 10, 3, 7, 11, 15]))
    first = (0x80 if draw(st.booleans()) else 0) | opcode | (draw(st.sampled_from([0, 0, 0, 0x10, 0x40])))
    masked = draw(st.booleans())
    payload = draw(st.one_of(st.binary(max_size=140), st.text(max_size=40).map(str.encode),
                             st.sampled_from([b"\x03\xe8", b"\x03\xe8bye", b"\x00", b"\x0b\xb8\xff", b""])))
    size_form = draw(st.sampled_from(["exact", "exact", "16", "64", "huge", "short"]))
    n = len(payload)
    if size_form == "16":
        head = bytes([first, (0x80 if masked else 0) | 126]) + n.to_bytes(2, "big")
    elif size_form == "64":
        head = bytes([first, (0x80 if masked else 0) | 127]) + n.to_bytes(8, "big")
    elif size_form == "huge":
        head = bytes([first, (0x80 if masked else 0) | 127]) + draw(st.integers(n, 2**64 - 1)).to_bytes(8, "big")
    elif size_form == "short":
        head = bytes([first, (0x80 if masked else 0) | min(n + draw(st.integers(1, 3)), 125)])
    else:
        full = W.encode_frame(opcode, payload)
        head = full[: len(full) - n]
        head = bytes([first, head[1] | (0x80 if masked else 0)]) + head[2:]
    mask = draw(st.binary(min_size=4, max_size=4)) if masked else b""
    return head + mask + (W.apply_mask(payload, mask) if masked else payload)


@pytest.mark.unit
@FUZZ
@given(st.lists(st.one_of(frame_like(), st.binary(max_size=20)), max_size=8), st.booleans(),
       st.sampled_from([8, 64, W.DEFAULT_MAX_MESSAGE]), st.data())
def test_the_frame_parser_raises_only_protocol_errors(frames: list[bytes], require_mask: bool, max_message: int,
                                                      draw) -> None:
    parser = W.FrameParser(max_message=max_message, require_mask=require_mask)
    stream = b"".join(frames)
    try:
        for piece in pieces_of(stream, splits(draw, len(stream))):
            for opcode, payload in parser.feed(piece):
                assert opcode in (W.OP_TEXT, W.OP_BINARY, W.OP_CLOSE, W.OP_PING, W.OP_PONG)
                if opcode in (W.OP_TEXT, W.OP_BINARY):
                    assert len(payload) <= max_message
                if opcode == W.OP_TEXT:
                    payload.decode("utf-8")
    except W.ProtocolError as err:
        assert err.code in (W.CLOSE_PROTOCOL_ERROR, W.CLOSE_INVALID_DATA, W.CLOSE_TOO_BIG)


@pytest.mark.unit
@FUZZ
@given(st.lists(st.tuples(st.sampled_from([W.OP_TEXT, W.OP_BINARY]), st.binary(max_size=300),
                          st.lists(st.integers(0, 300), max_size=3),
                          st.lists(st.tuples(st.sampled_from([W.OP_PING, W.OP_PONG]), st.binary(max_size=125)),
                                   max_size=3)), max_size=5),
       st.booleans(), st.binary(min_size=4, max_size=4), st.data())
def test_encoded_messages_parse_back_for_any_split(messages, masked: bool, mask: bytes, draw) -> None:
    stream = b""
    expected: list[tuple[int, bytes]] = []
    for opcode, body, cuts, controls in messages:
        if opcode == W.OP_TEXT:
            body = body.decode("utf-8", "replace").encode()
        bounds = sorted({0, len(body), *(c for c in cuts if c <= len(body))})
        parts = [body[a:b] for a, b in zip(bounds, bounds[1:], strict=False)] or [b""]
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            stream += W.encode_frame(opcode if index == 0 else W.OP_CONTINUATION, part, fin=last,
                                     mask=mask if masked else None)
            if not last and index < len(controls):  # a control frame between two fragments
                control, ping = controls[index]
                stream += W.encode_frame(control, ping, mask=mask if masked else None)
                expected.append((control, ping))
        expected.append((opcode, body))
    parser = W.FrameParser(require_mask=masked)
    got: list[tuple[int, bytes]] = []
    for piece in pieces_of(stream, splits(draw, len(stream))):
        got += parser.feed(piece)
    assert got == expected


@pytest.mark.unit
@FUZZ
@given(st.binary(max_size=130))
def test_parse_close_raises_only_protocol_errors(payload: bytes) -> None:
    try:
        code, reason = W.parse_close(payload)
    except W.ProtocolError:
        return
    assert 1000 <= code <= 4999 and isinstance(reason, str)


@pytest.mark.unit
@FUZZ
@given(st.one_of(st.sampled_from([1000, 1001, 1002, 1003, 1007, 1008, 1009, 1011]), st.integers(3000, 4999)),
       st.text(max_size=130))
def test_a_close_payload_parses_back_with_its_reason_cut_to_fit(code: int, reason: str) -> None:
    payload = W.close_payload(code, reason)
    assert len(payload) <= 125
    got_code, got_reason = W.parse_close(payload)
    assert got_code == code and reason.encode().startswith(got_reason.encode())
    assert len(got_reason.encode()) > 123 - 4 or got_reason == reason


@pytest.mark.unit
@FUZZ
@given(st.binary(max_size=100), st.binary(min_size=4, max_size=4))
def test_masking_twice_is_the_identity(payload: bytes, mask: bytes) -> None:
    assert W.apply_mask(W.apply_mask(payload, mask), mask) == payload


# ── the JSON-lines decoder ──────────────────────────────────────────────────────────────────────

@st.composite
def execd_frame(draw: Any) -> bytes:
    kind = draw(st.sampled_from([STDOUT, STDOUT, STDERR, REPLAY, 0x00, 0x04, 0xFF, None]))
    body = draw(st.one_of(stream_bytes, st.lists(json_objects, max_size=3).map(
        lambda objs: b"".join(json.dumps(o).encode() + b"\n" for o in objs))))
    if kind is None:
        return b""
    if kind == REPLAY:
        offset = draw(st.one_of(st.integers(0, 400), st.integers(0, 2**64 - 1)))
        header = offset.to_bytes(8, "big")[: draw(st.sampled_from([8, 8, 8, 3]))]
        return bytes([REPLAY]) + header + body
    return bytes([kind]) + body


@pytest.mark.unit
@pytest.mark.timeout(600)  # a hang guard: 108 s under two test runs at once
@FUZZ
@given(st.lists(execd_frame(), max_size=10), st.integers(0, 300), st.integers(1, 200), st.booleans(),
       st.booleans())
def test_the_json_lines_decoder_raises_only_its_own_errors(frames: list[bytes], since: int, max_line: int,
                                                           lenient: bool, use_feed: bool) -> None:
    decoder = JsonLineDecoder(since, max_line_bytes=max_line, lenient_stdout=lenient)
    try:
        for frame in frames:
            if use_feed:
                events = decoder.feed(frame)
            else:
                decoder.push(frame)
                events = []
                while (event := decoder.next_event()) is not None:
                    events.append(event)
            for event in events:
                assert isinstance(event, (Record, StderrText))
                if isinstance(event, Record):
                    assert isinstance(event.value, dict)
            assert decoder.resume_offset <= decoder.position
            assert len(decoder.stderr_tail.encode()) <= 8 * 1024 + 8
    except JsonLineError as err:
        with pytest.raises(type(err)):  # a failed decoder keeps failing, the same way
            decoder.next_event()


@pytest.mark.unit
@FUZZ
@given(st.integers(-(2**40), -1))
def test_a_negative_since_is_a_value_error(since: int) -> None:
    with pytest.raises(ValueError):
        JsonLineDecoder(since)


record_values = st.lists(st.dictionaries(st.sampled_from(["n", "s", "é", "\u2028"]),
                                         st.one_of(st.integers(), st.text(max_size=12)), max_size=3),
                         min_size=1, max_size=12)


@st.composite
def mixed_stream(draw: Any) -> tuple[list[tuple[int, bytes]], list[tuple[dict[str, Any], int]], str]:
    """stdout record lines (with blank lines) cut into frames anywhere, stderr frames between them:
    (frames, the records with their offsets, the stderr text)."""
    values = draw(record_values)
    lines = b""
    for value in values:
        lines += json.dumps(value, ensure_ascii=draw(st.booleans())).encode() + b"\n"
        if draw(st.integers(0, 5)) == 0:
            lines += draw(st.sampled_from([b"\n", b"  \n", b"\t\r\n"]))
    frames: list[tuple[int, bytes]] = []
    stderr = ""
    bounds = [0, *sorted(draw(st.lists(st.integers(0, len(lines)), max_size=10))), len(lines)]
    for a, b in zip(bounds, bounds[1:], strict=False):
        if a < b:
            frames.append((STDOUT, lines[a:b]))
        if draw(st.integers(0, 2)) == 0:
            text = draw(st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=10))
            frames.append((STDERR, text.encode()))
            stderr += text
    # The offsets: the combined (stdout + stderr) position just past each record's LF.
    expected: list[tuple[dict[str, Any], int]] = []
    position, line = 0, b""
    for kind, data in frames:
        if kind == STDERR:
            position += len(data)
            continue
        for byte in data:
            position += 1
            if byte == 0x0A:
                if line.strip(b" \t\r"):
                    expected.append((json.loads(line), position))
                line = b""
            else:
                line += bytes([byte])
    return frames, expected, stderr


@pytest.mark.unit
@FUZZ
@given(mixed_stream())
def test_records_and_offsets_are_exact_for_any_framing(stream) -> None:
    frames, expected, stderr = stream
    decoder = JsonLineDecoder(0)
    records: list[tuple[dict[str, Any], int]] = []
    text = ""
    for kind, data in frames:
        for event in decoder.feed(bytes([kind]) + data):
            if isinstance(event, Record):
                records.append((event.value, event.offset))
            else:
                text += event.text
    assert records == expected
    assert text == stderr
    assert decoder.position == sum(len(data) for _, data in frames) == decoder.resume_offset


@pytest.mark.unit
@FUZZ
@given(record_values, st.data())
def test_a_resume_at_the_cursor_delivers_the_rest_exactly_once(values: list[dict[str, Any]], draw) -> None:
    stream = b"".join(json.dumps(v).encode() + b"\n" for v in values)
    expected, end = [], 0
    for value in values:
        end = stream.index(b"\n", end) + 1
        expected.append((value, end))
    parts = pieces_of(stream, splits(draw, len(stream)))
    k = draw.draw(st.integers(0, len(parts)), label="cut after frame")
    first = JsonLineDecoder(0)
    got = [(e.value, e.offset) for p in parts[:k] for e in first.feed(bytes([STDOUT]) + p) if isinstance(e, Record)]
    cursor = first.resume_offset
    replay_to = draw.draw(st.integers(cursor, len(stream)), label="replay up to")
    second = JsonLineDecoder(cursor)
    replay = bytes([REPLAY]) + cursor.to_bytes(8, "big") + stream[cursor:replay_to]
    got += [(e.value, e.offset) for e in second.feed(replay) if isinstance(e, Record)]
    for piece in pieces_of(stream[replay_to:], splits(draw, len(stream) - replay_to, "live")):
        got += [(e.value, e.offset) for e in second.feed(bytes([STDOUT]) + piece) if isinstance(e, Record)]
    assert got == expected
    if cursor < len(stream):  # a replay that starts later than asked is a gap, never a silent skip
        with pytest.raises(ReplayGap):
            JsonLineDecoder(cursor).feed(bytes([REPLAY]) + (cursor + 1).to_bytes(8, "big") + stream[cursor + 1 :])


# ── the magics ──────────────────────────────────────────────────────────────────────────────────

cell_text = st.lists(st.sampled_from(["%", "%%", "\n", " ", "\t", "\r", "x", "write", "read a.txt", "--", "\\",
                                      "shell", "é", "%%write f", "%ls", "echo hi"]), max_size=20).map("".join)


@pytest.mark.unit
@FUZZ
@given(st.one_of(cell_text, st.text(max_size=60)))
def test_parse_cell_reads_any_text(code: str) -> None:
    parsed = parse_cell(code)
    head = code.lstrip("\n\r\t ")
    assert (parsed is None) == (not head.startswith("%"))
    if parsed is not None:
        if head.startswith("%%"):
            assert parsed.cell is not None and not parsed.lines
            assert parsed.cell[2] == head.partition("\n")[2]
        else:
            assert parsed.cell is None and parsed.lines
            assert all("\n" not in name + args for name, args in parsed.lines)


MAGICS = all_magics()


def _option_words() -> list[str]:
    words = {"--", "-", "-h", "--help", "x", "1", "-1", "0", "1:2", "a:b", ":", "1:", "=", "4M", "off", "nan",
             "limit", "K:V", "-x", "--nope", "--lines=1:2"}
    for found in MAGICS.values():
        for action in found.parser._actions:  # noqa: SLF001 - the parser's own options, as words to fuzz with
            words.update(action.option_strings)
    return sorted(words)


@pytest.mark.unit
@pytest.mark.parametrize("key", sorted(MAGICS), ids=lambda key: f"{'%%' if key[0] == 'cell' else '%'}{key[1]}")
@settings(FUZZ, max_examples=examples(120))
@given(tokens=st.lists(st.one_of(st.sampled_from(_option_words()), st.text(max_size=8)), max_size=8))
def test_every_magic_parser_accepts_or_says_usage(key: tuple[str, str], tokens: list[str]) -> None:
    try:
        args = MAGICS[key].parser.parse_args(tokens)
    except UsageError as err:
        assert str(err)
        return
    assert isinstance(args, argparse.Namespace)


@pytest.mark.unit
@FUZZ
@given(st.one_of(st.text(max_size=12), st.sampled_from(["1:2", "1:", ":5", "a:b", "1:2:3", "", ":", " 1 : 2 "])))
def test_a_span_is_two_numbers_or_a_usage_error(text: str) -> None:
    try:
        first, last = _span(text, "--lines")
    except UsageError:
        return
    assert isinstance(first, int) and (last is None or isinstance(last, int))


@pytest.mark.unit
@FUZZ
@given(st.one_of(st.text(max_size=60), st.lists(st.one_of(json_objects.map(json.dumps), st.text(max_size=10)),
                                                max_size=4).map("\n".join)))
def test_send_records_parse_or_say_usage(text: str) -> None:
    try:
        records = _parse_records(text)
    except UsageError:
        return
    assert records and all(isinstance(record, dict) for record in records)


@pytest.mark.unit
@FUZZ
@given(st.lists(st.text(max_size=10), max_size=4))
def test_headers_parse_or_say_usage(pairs: list[str]) -> None:
    try:
        headers = _headers(pairs)
    except UsageError:
        return
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())


# ── the bash completeness check ─────────────────────────────────────────────────────────────────

BASH_WORDS = ["if", "then", "elif", "else", "fi", "for", "while", "until", "do", "done", "case", "in", "esac", ";;",
              ";&", "{", "}", "(", ")", "((", "))", "[[", "]]", "function", "f()", "select", "coproc", "'", '"',
              "$'", "`", "$(", "${", "$((", "<(", ">(", "a=(", "<<", "<<-", "<<EOF", "<<'EOF'", "EOF", "\n", "\\",
              "\\\n", "|", "||", "&&", "&", ";", "#", " ", "\t", "x", "echo", "$x", ">", "2>&1", "!", "=", "%",
              "%%", "é"]
bash_text = st.lists(st.sampled_from(BASH_WORDS), max_size=40).map(" ".join)
bash_text_tight = st.lists(st.sampled_from(BASH_WORDS), max_size=40).map("".join)


@pytest.mark.unit
@FUZZ
@given(st.one_of(bash_text, bash_text_tight, st.text(max_size=80)))
@example("$(" * 5000)
@example("{ " * 5000)
@example("cat <<EOF\n" * 300)
def test_the_completeness_check_answers_any_text(code: str) -> None:
    status, indent = completeness.check(code)
    assert status in ("complete", "incomplete", "invalid")
    if status != "incomplete":
        assert indent == ""
    else:
        assert set(indent) <= {" "} and len(indent) % 2 == 0  # four spaces a block, two for a case branch


# ── bugs found by this file ─────────────────────────────────────────────────────────────────────

@pytest.mark.unit
@FUZZ
@given(st.text(max_size=20))
@example("² {\"id\": 1}")
def test_send_numbers_split_or_say_usage(text: str) -> None:
    try:
        number, timeout, _no_wait, _rest = _send_options(text)
    except UsageError:
        return
    assert number is None or isinstance(number, int)
    assert timeout is None or timeout > 0


@pytest.mark.unit
def test_past_the_limit_the_last_part_shows_even_when_live_frames_carried_it() -> None:
    text = "".join(f"{i}\n" for i in range(1, 2001))
    view = CellOutput(limit=1000)
    for start in range(0, len(text), 500):  # the live view receives every character
        view.live({"stream": "stdout", "text": text[start : start + 500], "offset": start})
    record = OutputRecord(1000, lambda: ("/tmp/x.log", open(os.devnull, "wb")))  # noqa: SIM115
    record.add("stdout", text.encode(), text)
    output = record.finish()
    view.finish({"output": output, "truncated": True, "output_chars": len(text), "log_path": "/tmp/x.log",
                 "tail_chars": record.tail_chars})
    events = view.take()
    shown = "".join(e.text for e in events if isinstance(e, Stream))
    assert shown.endswith("1999\n2000\n"), events[-3:]


DEEP_LINE = b"[" * 100_000  # nesting deeper than Python's recursion limit


@pytest.mark.unit
def test_a_deeply_nested_line_is_not_a_frame() -> None:
    assert P.decode(DEEP_LINE) is None


@pytest.mark.system
def test_the_daemon_answers_after_a_deeply_nested_frame(zipapp: Path, workspace: Path) -> None:
    import socket

    from owsandbox.host.providers.local import LocalProvider

    provider = LocalProvider(cwd=workspace, runner_path=zipapp)
    provider.create()
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(3)
            sock.connect(provider.socket_path)
            sock.sendall(DEEP_LINE + b"\n" + P.encode(P.request("after", "shell.run", {"command": "echo alive"})))
            reader = sock.makefile("rb")
            try:
                answer = json.loads(reader.readline())
            except (TimeoutError, ValueError) as exc:
                raise AssertionError(f"no answer after a deeply nested frame: {exc!r}") from None
        assert answer["id"] == "after" and answer["result"]["output"] == "alive\n"
    finally:
        provider.destroy()


# The magics' bad values, through a real kernel: the cell must end in a UsageError, not a KernelError or
# a setting that breaks every later cell.

@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory):
    from tests.kernel_session import KernelSession

    session = KernelSession(tmp_path_factory.mktemp("fuzz-kernel"))
    try:
        yield session
    finally:
        session.close()


@pytest.mark.system
@pytest.mark.parametrize("value", ["inf", "1e400"])
def test_output_limit_refuses_an_infinite_size(kernel, value: str) -> None:
    run = kernel.run(f"%output limit {value}")
    kernel.run("%output limit 4M")
    assert run.status == "error" and run.error["ename"] == "UsageError", run.error


@pytest.mark.system
def test_timeout_refuses_nan(kernel) -> None:
    run = kernel.run("%timeout nan")
    after = kernel.run("echo fine")
    kernel.run("%timeout off")
    assert run.status == "error" and run.error["ename"] == "UsageError", run.outputs
    assert after.status == "ok", after.outputs


@pytest.mark.system
def test_send_with_a_superscript_number_is_a_usage_error(kernel) -> None:
    run = kernel.run('%send ² {"id": 1}')
    assert run.status == "error" and run.error["ename"] == "UsageError", run.error
