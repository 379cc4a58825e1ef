"""The sans-I/O cores, fed bytes and times: framing, outbox, ledger, markers, batching, the record."""

from __future__ import annotations

import io

import pytest

from owsandbox import protocol as P
from owsandbox.box.outbox import ANSWERED, NEW, RUNNING, Outbox, RequestLedger
from owsandbox.box.shell.capture import MARKER_START, LiveBatcher, MarkerScanner, OutputRecord, StreamDecoder
from owsandbox.box.shell.lines import ansi_c_quote
from owsandbox.host.session import SeqTracker

# -- framing ------------------------------------------------------------------------------------

AWKWARD = "two\nlines\r\n\ttab \x00 nul \u2028 sep \u2029 para ☃ 🎉 \x1b[31mred\x1b[0m"


@pytest.mark.unit
def test_any_payload_encodes_to_exactly_one_ascii_line():
    frame = P.encode(P.result("id-1", {"output": AWKWARD}))
    assert frame.endswith(b"\n") and frame.count(b"\n") == 1
    assert frame.isascii()
    assert P.encode(P.result("x", {"a": [1, 2]})) == b'{"jsonrpc":"2.0","id":"x","result":{"a":[1,2]}}\n'
    assert P.decode(frame)["result"]["output"] == AWKWARD


@pytest.mark.unit
@pytest.mark.parametrize("line", [b"Welcome to Ubuntu 24.04 LTS", b"[1, 2, 3]", b"{broken json", b"\xff\xfe{}",
                                  b'"just a string"', b"42", b""])
def test_lines_that_are_not_json_objects_are_not_frames(line):
    assert P.decode(line) is None


@pytest.mark.unit
def test_the_splitter_joins_lines_across_reads_and_cuts_many_in_one():
    splitter = P.LineSplitter(max_line=100)
    assert splitter.feed(b'{"a":') == []
    assert splitter.feed(b'1}\n{"b":2}\n{"c"') == [b'{"a":1}', b'{"b":2}']
    assert splitter.feed(b":3}\n") == [b'{"c":3}']
    assert splitter.buffered == 0


@pytest.mark.unit
def test_the_splitter_reports_a_line_over_the_limit_and_carries_on():
    splitter = P.LineSplitter(max_line=64)
    head = P.encode(P.request("the-id", "shell.run", {"command": "x" * 200}))
    events = splitter.feed(head[:30]) + splitter.feed(head[30:] + b'{"next":1}\n')
    assert isinstance(events[0], P.Oversize) and events[0].size == len(head) - 1
    assert P.sniff_id(events[0].head) == "the-id"
    assert events[1] == b'{"next":1}'
    assert splitter.buffered == 0


@pytest.mark.unit
def test_sniffing_finds_numeric_ids_and_gives_none_without_one():
    assert P.sniff_id(b'{"jsonrpc":"2.0","id":17,"method"') == 17
    assert P.sniff_id(b'{"jsonrpc":"2.0","method":"x"') is None


# -- outbox and ledger --------------------------------------------------------------------------

def _frame(seq: int) -> bytes:
    return P.encode({"seq": seq})


@pytest.mark.unit
def test_the_outbox_keeps_answers_until_acked_and_replays_after_a_seq():
    box = Outbox()
    seqs = [box.add(_frame, f"r{i}")[0] for i in range(4)]
    assert seqs == [1, 2, 3, 4]
    box.ack(2)
    frames, gap = box.replay(2)
    assert [P.decode(f)["seq"] for f in frames] == [3, 4] and gap is False
    assert box.replay(3)[0] == [_frame(4)]
    assert box.frame_for(1) is None and box.frame_for(3) == _frame(3)


@pytest.mark.unit
def test_an_outbox_that_had_to_drop_says_there_is_a_gap():
    box = Outbox(max_items=2)
    for i in range(5):
        box.add(_frame, i)
    frames, gap = box.replay(0)
    assert [P.decode(f)["seq"] for f in frames] == [4, 5] and gap is True
    assert box.replay(3) == (frames, False)  # the client had seen everything dropped


@pytest.mark.unit
def test_the_outbox_is_bounded_by_bytes_too():
    box = Outbox(max_items=100, max_bytes=50)
    for i in range(10):
        box.add(lambda seq: P.encode({"seq": seq, "pad": "x" * 20}), i)
    assert len(box) == 1 and box.size_bytes <= 50 + 40


@pytest.mark.unit
def test_the_ledger_runs_an_id_once():
    ledger = RequestLedger()
    assert ledger.begin("a") == (NEW, None)
    assert ledger.begin("a") == (RUNNING, None)
    ledger.answered("a", 7)
    assert ledger.begin("a") == (ANSWERED, 7)
    assert ledger.begin(1) == (NEW, None) and ledger.begin("1") == (NEW, None)  # 1 and "1" differ


@pytest.mark.unit
def test_the_ledger_forgets_the_oldest_ids_first():
    ledger = RequestLedger(max_ids=2)
    for rid in ("a", "b", "c"):
        ledger.begin(rid)
    assert ledger.begin("a") == (NEW, None) and ledger.begin("c") == (RUNNING, None)


@pytest.mark.unit
def test_the_client_seq_tracker_counts_only_a_gapless_prefix():
    seen = SeqTracker(10)
    assert seen.saw(12) and seen.contiguous == 10
    assert seen.saw(11) and seen.contiguous == 12
    assert not seen.saw(12) and not seen.saw(3)


# -- markers, decoding, batching, the record ----------------------------------------------------

def marker(payload: bytes) -> bytes:
    return MARKER_START + payload + b"\n"


@pytest.mark.unit
def test_the_scanner_splits_output_from_markers_in_order():
    scanner = MarkerScanner()
    events = scanner.feed(b"hello" + marker(b"tok:0:/tmp") + b"after")
    assert events == [("data", b"hello"), ("marker", b"tok:0:/tmp"), ("data", b"after")]


@pytest.mark.unit
def test_the_scanner_holds_back_only_what_could_be_a_marker():
    scanner = MarkerScanner()
    whole = b"line\n" + marker(b"t:1:/x")
    events = []
    for i in range(len(whole)):  # one byte at a time
        events += scanner.feed(whole[i : i + 1])
    assert b"".join(p for k, p in events if k == "data") == b"line\n"
    assert [p for k, p in events if k == "marker"] == [b"t:1:/x"]
    assert MarkerScanner().feed(b"plain text\n") == [("data", b"plain text\n")]
    assert MarkerScanner().feed(b"ends with \x1f") == [("data", b"ends with ")]


@pytest.mark.unit
def test_a_marker_start_without_an_end_is_eventually_let_through():
    scanner = MarkerScanner()
    noise = MARKER_START + b"x" * 20000
    assert b"".join(p for _, p in scanner.feed(noise)).startswith(MARKER_START[:1])


@pytest.mark.unit
def test_decoding_survives_characters_split_across_reads_and_bad_bytes():
    decoder = StreamDecoder()
    snowman = "☃".encode()
    assert decoder.decode(snowman[:1]) == "" and decoder.decode(snowman[1:] + b"\xff") == "☃\ufffd"


@pytest.mark.unit
def test_the_batcher_sends_nothing_before_the_delay():
    batcher = LiveBatcher(delay=0.05)
    assert batcher.add("stdout", "quick\n", now=0.0) == []
    assert batcher.deadline() == 0.05
    batcher.discard()
    assert batcher.deadline() is None


@pytest.mark.unit
def test_the_batcher_keeps_runs_of_each_stream_in_order_with_offsets():
    batcher = LiveBatcher(delay=0.05)
    batcher.add("stdout", "a", 0.0)
    batcher.add("stdout", "b", 0.01)
    batcher.add("stderr", "E", 0.02)
    frames = batcher.add("stdout", "c", 0.06)
    assert frames == [{"stream": "stdout", "text": "ab", "offset": 0},
                      {"stream": "stderr", "text": "E", "offset": 2},
                      {"stream": "stdout", "text": "c", "offset": 3}]


@pytest.mark.unit
def test_the_batcher_flushes_early_when_enough_is_pending():
    batcher = LiveBatcher(delay=10, max_chars=10)
    assert batcher.add("stdout", "12345", 0) == []
    assert batcher.add("stdout", "67890", 0) == [{"stream": "stdout", "text": "1234567890", "offset": 0}]


def _record(limit: int) -> tuple[OutputRecord, io.BytesIO]:
    log = io.BytesIO()
    log.close = lambda: None  # keep it readable after finish()
    return OutputRecord(limit, lambda: ("/logs/x.log", log)), log


@pytest.mark.unit
def test_the_record_keeps_everything_under_the_limit_with_stream_runs():
    record, log = _record(100)
    for stream, text in (("stdout", "ab"), ("stdout", "c"), ("stderr", "E"), ("stdout", "d")):
        record.add(stream, text.encode(), text)
    assert record.finish() == "abcEd" and not record.truncated
    assert record.segments == [["stdout", 3], ["stderr", 1], ["stdout", 1]]
    assert log.getvalue() == b""


@pytest.mark.unit
def test_the_record_past_the_limit_keeps_head_and_tail_and_logs_everything():
    record, log = _record(20)
    chunks = [f"{i:03d}\n" for i in range(100)]
    for chunk in chunks:
        record.add("stdout", chunk.encode(), chunk)
    text = record.finish()
    assert record.truncated and record.segments is None
    assert log.getvalue() == "".join(chunks).encode()
    assert text.startswith("000\n001\n") and text.endswith("098\n099\n")
    assert "/logs/x.log" in text and f"{400 - 20} characters omitted" in text
    assert record.output_bytes == 400


@pytest.mark.unit
def test_the_record_gives_up_on_runs_when_streams_interleave_too_finely():
    record, _ = _record(1 << 20)
    for i in range(OutputRecord.MAX_SEGMENTS + 1):
        record.add("stdout" if i % 2 else "stderr", b"x", "x")
    assert record.segments is None and not record.truncated


@pytest.mark.parametrize("text", ["plain", "it's", "back\\slash", "new\nline", "tab\tand\x01ctl", "☃ ü", "$HOME `x`"])
def test_ansi_c_quoting_yields_the_exact_text_in_bash(text):
    import subprocess

    out = subprocess.run(["bash", "-c", f"printf %s {ansi_c_quote(text)}"], capture_output=True, timeout=10).stdout
    assert out == text.encode()


@pytest.mark.unit
def test_a_display_record_holds_one_request_per_line_as_the_protocol_spells_it():
    from owsandbox.protocol.messages import DisplayRequest, display_requests

    asked = [DisplayRequest("/w/plot.png", "image/png", "fig"), DisplayRequest("/w/a b.svg", "", "")]
    assert display_requests("".join(request.line() for request in asked)) == asked
    assert display_requests("only-a-mime") == [DisplayRequest("", "only-a-mime", "")]  # missing fields are empty
