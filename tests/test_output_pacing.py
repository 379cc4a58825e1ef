"""Output floods and a Jupyter server's rate limit, without a server: the pacer's arithmetic on a clock of
the test's own, and the outbox turning a flood into one live tail and a note, checked message by message
as a server would count them (the bytes of `stream` messages in any window of 3 s)."""

from __future__ import annotations

from typing import Any

import pytest

from owsandbox.kernel.cell.outbox import Outbox
from owsandbox.kernel.cell.pacing import (
    DEFAULT_BURST,
    DEFAULT_RATE,
    TAIL_CHARS,
    TAIL_LINES,
    FloodTail,
    StreamPacer,
    message_size,
    pacer_from_env,
    pieces,
)

pytestmark = pytest.mark.unit

SERVER_LIMIT = 1_000_000  # a default Jupyter server: bytes a second of stream messages
SERVER_WINDOW = 3.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_bucket_lets_a_burst_through_then_the_rate():
    clock = Clock()
    pacer = StreamPacer(rate=1000, burst=2000, clock=clock)
    assert pacer.admit(1500) and not pacer.admit(600) and pacer.admit(500)
    clock.now += 0.5
    assert not pacer.admit(501) and pacer.admit(500)
    clock.now += 100
    assert pacer.admit(2000) and not pacer.admit(1)  # never more than the burst saved up


def test_a_rate_of_zero_is_unpaced_and_a_bad_setting_names_the_variable():
    assert StreamPacer(0, 0).admit(10**9)
    assert pacer_from_env({"OWSANDBOX_OUTPUT_RATE": "0"}).unpaced
    assert pacer_from_env({"OWSANDBOX_OUTPUT_RATE": "2000"}).burst == 4000
    assert pacer_from_env({}).rate == DEFAULT_RATE
    for bad in ("fast", "-1"):
        with pytest.raises(ValueError, match=f"OWSANDBOX_OUTPUT_RATE='{bad}' is not a number"):
            pacer_from_env({"OWSANDBOX_OUTPUT_RATE": bad})


def test_the_tail_keeps_the_last_lines_within_bounds_whatever_comes():
    tail = FloodTail("t", clock=Clock())
    for number in range(1, 100_001):
        tail.add(f"{number}\n")
    assert tail.lines == 100_000 and tail.chars == sum(len(f"{n}\n") for n in range(1, 100_001))
    shown = tail.text(ended=True).splitlines()
    assert shown[1:] == [str(n) for n in range(100_001 - TAIL_LINES, 100_001)]
    tail.add("x" * 10 * TAIL_CHARS)  # one endless line: its end, within the bound
    assert len(tail.text()) < 2 * TAIL_CHARS and tail.text().endswith("x" * 100)


class Wire:
    def __init__(self) -> None:
        self.sent: list[tuple[float, str, dict[str, Any]]] = []

    def __call__(self, clock: Clock):
        def send(parent: dict[str, Any], msg_type: str, content: dict[str, Any]) -> None:
            self.sent.append((clock.now, msg_type, content))
        return send


def _flood(outbox: Outbox, clock: Clock, lines: int, per_batch: int, seconds_per_batch: float,
           parent: dict[str, Any]) -> None:
    for start in range(1, lines + 1, per_batch):
        text = "".join(f"{n}\n" for n in range(start, min(start + per_batch, lines + 1)))
        outbox.send(parent, "stream", {"name": "stdout", "text": text}, counted=True)
        clock.now += seconds_per_batch
    outbox.end_cell(parent)


def test_seq_one_million_stays_under_a_default_servers_rate_and_ends_with_its_last_line_and_a_note():
    clock, wire = Clock(), Wire()
    outbox = Outbox(wire(clock), lambda: 10**9, StreamPacer(clock=clock))
    parent = {"header": {"msg_id": "cell-1"}}
    _flood(outbox, clock, 1_000_000, per_batch=20_000, seconds_per_batch=0.03, parent=parent)  # 4.6 MB/s
    streams = [(at, message_size(content["text"])) for at, kind, content in wire.sent if kind == "stream"]
    for at, _ in streams:  # no window of the server's holds more than it lets through
        assert sum(size for when, size in streams if at <= when < at + SERVER_WINDOW) \
            <= SERVER_LIMIT * SERVER_WINDOW
    assert sum(size for _, size in streams) <= DEFAULT_BURST + DEFAULT_RATE * (clock.now - 100.0)
    shown = "".join(content["text"] for _, kind, content in wire.sent if kind == "stream")
    assert shown.startswith("1\n2\n3\n") and shown.count("\n") < 1_000_000
    tails = [content for _, kind, content in wire.sent if kind in ("display_data", "update_display_data")
             and content.get("metadata", {}).get("owsandbox", {}).get("flood")]
    assert [kind for _, kind, content in wire.sent if content in tails][:2] == ["display_data",
                                                                                "update_display_data"]
    assert len({tail["transient"]["display_id"] for tail in tails}) == 1
    assert len(tails) <= (clock.now - 100.0) / 0.5 + 2  # redrawn a few times a second, not per batch
    last = tails[-1]["data"]["text/plain"]
    assert last.endswith("999999\n1000000") and "not shown as it came" in last
    hidden = 1_000_000 - shown.count("\n")
    assert f"({hidden:,} lines)" in last
    note = wire.sent[-1][2]
    assert wire.sent[-1][1] == "display_data" and note["metadata"] == {"owsandbox": {"note": True}}
    assert f"({hidden:,} lines) were not streamed" in note["data"]["text/plain"]


def test_output_within_the_rate_is_streamed_whole_with_no_tail_or_note():
    clock, wire = Clock(), Wire()
    outbox = Outbox(wire(clock), lambda: 10**9, StreamPacer(clock=clock))
    parent = {"header": {"msg_id": "cell-2"}}
    _flood(outbox, clock, 100_000, per_batch=1_000, seconds_per_batch=0.03, parent=parent)  # 0.2 MB/s
    assert {kind for _, kind, _ in wire.sent} == {"stream"}
    assert "".join(content["text"] for _, _, content in wire.sent) == "".join(f"{n}\n" for n in range(1, 100_001))


def test_a_flood_in_one_cell_does_not_take_the_next_cells_output_once_the_rate_has_room_again():
    clock, wire = Clock(), Wire()
    outbox = Outbox(wire(clock), lambda: 10**9, StreamPacer(clock=clock))
    _flood(outbox, clock, 300_000, per_batch=50_000, seconds_per_batch=0.03, parent={"header": {"msg_id": "a"}})
    clock.now += 5
    wire.sent.clear()
    outbox.send({"header": {"msg_id": "b"}}, "stream", {"name": "stdout", "text": "calm\n"})
    assert [(kind, content) for _, kind, content in wire.sent] == [("stream", {"name": "stdout", "text": "calm\n"})]


def test_a_long_text_is_paced_in_pieces_cut_at_line_ends():
    text = "".join(f"{n:07d}\n" for n in range(100_000))  # 800,000 characters
    cut = pieces(text, 100_000)
    assert "".join(cut) == text and all(len(piece) <= 100_000 and piece.endswith("\n") for piece in cut)
    assert pieces("x" * 250, 100) == ["x" * 100, "x" * 100, "x" * 50] and pieces("") == []


def test_one_message_larger_than_the_burst_goes_when_the_bucket_is_full_and_the_next_waits():
    clock = Clock()
    pacer = StreamPacer(rate=1000, burst=2000, clock=clock)
    assert pacer.admit(5000) and not pacer.admit(1)  # in debt: 3000 to pay back, 3 s at the rate
    clock.now += 2.9
    assert not pacer.admit(1)
    clock.now += 0.2
    assert pacer.admit(1)


def test_a_magics_long_answer_streams_its_head_and_tails_the_rest():
    clock, wire = Clock(), Wire()
    outbox = Outbox(wire(clock), lambda: 10**9, StreamPacer(clock=clock))
    parent = {"header": {"msg_id": "cell-3"}}
    text = "".join(f"record {n}\n" for n in range(400_000))  # 5.7 MB in one stream message
    outbox.send(parent, "stream", {"name": "stdout", "text": text})
    outbox.end_cell(parent)
    streamed = "".join(content["text"] for _, kind, content in wire.sent if kind == "stream")
    assert text.startswith(streamed) and DEFAULT_BURST // 2 <= len(streamed) <= DEFAULT_BURST
    tails = [content["data"]["text/plain"] for _, kind, content in wire.sent
             if kind in ("display_data", "update_display_data") and "flood" in content["metadata"].get("owsandbox", {})]
    assert tails[-1].endswith("record 399999")
