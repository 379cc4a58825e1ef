"""The kernel's side of "cells behave as in a terminal", without a kernel or a sandbox:

* `CellOutput` holding back the unfinished last line (shown when finished, at the end, after
  `hold_seconds`, or turned into the prompt of an input request), keeping the order the streams were
  written in, and reducing terminal text (fed frames as the runner client delivers them, on a fake clock);
* `StdinChannel` asking on a real ZMQ ROUTER socket answered by a fake frontend (a DEALER socket with
  a jupyter_client Session), with waits that end when cancelled;
* `CellPrompts` with a fake `ask` and a fake `shell.input` sender standing in for the client.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future
from contextlib import suppress
from typing import Any

import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jupyter_client.session import Session

from owsandbox.kernel.cell.output import CellOutput, Display, InputWanted, Notice, Stream
from owsandbox.kernel.editing.stdin import EOF, CellPrompts, StdinChannel, answers

from .fuzz_budget import examples
from .waiting import WaitTimeout, patience, wait_until

FUZZ = settings(max_examples=examples(300), deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Feed:
    """Frames with offsets, as the sandbox sends them for one command."""

    def __init__(self, view: CellOutput) -> None:
        self.view = view
        self.offset = 0
        self.whole = ""

    def __call__(self, stream: str, text: str) -> None:
        self.view.live({"stream": stream, "text": text, "offset": self.offset})
        self.offset += len(text)
        self.whole += text

    def finish(self) -> None:
        self.view.finish({"output": self.whole, "exit_code": 0})


def make(terminal: bool = True) -> tuple[CellOutput, Feed, Clock]:
    clock = Clock()
    view = CellOutput(terminal=terminal, clock=clock)
    return view, Feed(view), clock


def shown(events: list[Any]) -> list[tuple[str, str]]:
    return [(e.name, e.text) for e in events if isinstance(e, Stream)]


# -- the unfinished last line ---------------------------------------------------------------------

@pytest.mark.unit
def test_finished_lines_show_at_once_and_the_unfinished_rest_waits_for_its_end():
    view, feed, _ = make()
    feed("stdout", "one\ntw")
    assert shown(view.take()) == [("stdout", "one\n")]
    assert view.hold_deadline() is not None
    feed("stdout", "o\nthree")
    assert shown(view.take()) == [("stdout", "two\n")]
    feed.finish()
    assert shown(view.take()) == [("stdout", "three")]
    assert view.hold_deadline() is None


@pytest.mark.unit
def test_a_carriage_return_ends_a_line_too_so_progress_lines_show():
    view, feed, _ = make()
    feed("stdout", "10%\r20%\r30")
    assert shown(view.take()) == [("stdout", "10%\r20%\r")]


@pytest.mark.unit
def test_an_unfinished_line_shows_after_the_hold_time_and_the_clock_starts_with_the_line():
    view, feed, clock = make()
    feed("stdout", "working")
    assert view.hold_deadline() == pytest.approx(100.25)
    clock.now += 0.2
    feed("stdout", "...")  # more of the same line: it does not wait longer
    assert view.take() == [] and view.hold_deadline() == pytest.approx(100.25)
    clock.now += 0.05
    assert shown(view.take()) == [("stdout", "working...")]
    feed("stdout", " done\nnext")
    assert shown(view.take()) == [("stdout", " done\n")]
    assert view.hold_deadline() == pytest.approx(clock.now + 0.25)


@pytest.mark.unit
def test_stderr_never_overtakes_stdout_written_before_it():
    view, feed, _ = make()
    feed("stdout", "abc")
    feed("stderr", "x")
    feed("stdout", "def\n")
    feed("stderr", "y\n")
    assert shown(view.take()) == [("stdout", "abc"), ("stderr", "x"), ("stdout", "def\n"), ("stderr", "y\n")]


@pytest.mark.unit
def test_a_display_record_shows_after_the_text_before_it_even_from_a_terminal():
    view, feed, _ = make()
    feed("stdout", "before")
    feed("stdout", "\n")
    feed("display", "image/png\tfig\t/w/plot.png\n")  # the shell's own record of an owdisplay line
    feed("stdout", "after\n")
    events = view.take()
    assert [type(e) for e in events] == [Stream, Display, Stream]
    assert events[1] == Display("/w/plot.png", "image/png", "fig")


@pytest.mark.unit
def test_notices_of_the_output_limit_come_after_the_held_text():
    clock = Clock()
    view = CellOutput(limit=10, terminal=True, clock=clock)
    view.live({"stream": "stdout", "text": "12345", "offset": 0})
    view.live({"stream": "stdout", "text": "6789012345", "offset": 5})
    events = view.take()
    assert isinstance(events[0], Stream) and events[0].text == "1234567890"
    assert isinstance(events[1], Notice)


@pytest.mark.unit
def test_a_long_line_without_a_break_is_not_held():
    view, feed, _ = make()
    feed("stdout", "x" * 5000)
    assert shown(view.take()) == [("stdout", "x" * 5000)] and view.hold_deadline() is None


# -- prompts --------------------------------------------------------------------------------------

@pytest.mark.unit
def test_the_prompt_becomes_the_input_request_and_is_not_shown():
    view, feed, _ = make()
    feed("stdout", "hello\nYour name? ")
    view.input_wanted({"prompt": "Your name? ", "password": False})
    assert view.take() == [Stream("stdout", "hello\n"), InputWanted("Your name? ", False)]
    feed("stdout", "hello Ada\n")
    feed.finish()
    assert shown(view.take()) == [("stdout", "hello Ada\n")]


@pytest.mark.unit
def test_a_prompt_on_stderr_as_bash_read_p_writes_it_and_a_password_prompt():
    view, feed, _ = make()
    feed("stderr", "pw: ")
    view.input_wanted({"prompt": "pw: ", "password": True})
    assert view.take() == [InputWanted("pw: ", True)]


@pytest.mark.unit
def test_without_a_prompt_from_the_sandbox_the_unfinished_line_is_the_prompt():
    view, feed, _ = make()
    feed("stdout", "a? ")
    view.input_wanted({"prompt": "", "password": False})
    assert view.take() == [InputWanted("a? ", False)]


@pytest.mark.unit
def test_text_before_the_prompt_on_the_same_line_is_shown():
    view, feed, _ = make()
    feed("stdout", "[step 2] ")
    feed("stdout", "continue? ")
    view.input_wanted({"prompt": "continue? ", "password": False})
    assert view.take() == [Stream("stdout", "[step 2] "), InputWanted("continue? ", False)]


@pytest.mark.unit
def test_a_coloured_prompt_asks_in_plain_words():
    view, feed, _ = make()
    feed("stdout", "\x1b[1;32mName?\x1b[0m ")
    view.input_wanted({"prompt": "\x1b[1;32mName?\x1b[0m ", "password": False})
    assert view.take() == [InputWanted("Name? ", False)]


@pytest.mark.unit
def test_a_prompt_announced_before_its_text_arrives_is_not_shown_when_it_comes():
    view, feed, _ = make()
    view.input_wanted({"prompt": "b? ", "password": False})
    feed("stdout", "b")
    feed("stdout", "? ")
    feed("stdout", "2\n")
    assert view.take() == [InputWanted("b? ", False), Stream("stdout", "2\n")]


@pytest.mark.unit
def test_a_prompt_already_shown_after_the_hold_time_is_not_taken_out_of_later_output():
    view, feed, clock = make()
    feed("stdout", "Name: ")
    clock.now += 1
    assert shown(view.take()) == [("stdout", "Name: ")]
    view.input_wanted({"prompt": "Name: ", "password": False})
    feed("stdout", "\nName: Ada\n")
    assert view.take() == [InputWanted("Name: ", False), Stream("stdout", "\nName: Ada\n")]


@pytest.mark.unit
def test_two_reads_are_two_prompts():
    view, feed, _ = make()
    feed("stdout", "a? ")
    view.input_wanted({"prompt": "a? ", "password": False})
    feed("stdout", "1\nb? ")
    view.input_wanted({"prompt": "b? ", "password": False})
    assert view.take() == [InputWanted("a? ", False), Stream("stdout", "1\n"), InputWanted("b? ", False)]


# -- terminal text ---------------------------------------------------------------------------------

@pytest.mark.unit
def test_on_a_terminal_both_streams_are_reduced_even_when_a_sequence_is_split_between_frames():
    view, feed, _ = make(terminal=True)
    feed("stdout", "\x1b[3")
    feed("stdout", "1mred\x1b[0m\x1b[")
    feed("stdout", "K\n")
    feed("stderr", "\x1b]0;title\x07warn\x1b[2K\n")
    assert shown(view.take()) == [("stdout", "\x1b[31mred\x1b[0m\n"), ("stderr", "warn\n")]


@pytest.mark.unit
def test_off_a_terminal_the_text_is_exact():
    view, feed, _ = make(terminal=False)
    feed("stdout", "\x1b[K\x07raw\n")
    assert shown(view.take()) == [("stdout", "\x1b[K\x07raw\n")]


adds = st.lists(st.tuples(st.sampled_from(["stdout", "stderr"]),
                          st.text(st.sampled_from(list("ab\n\r ")), min_size=1, max_size=12),
                          st.sampled_from(["none", "take", "tick"])), max_size=40)


@pytest.mark.unit
@FUZZ
@given(adds)
def test_whatever_the_timing_every_character_shows_once_in_the_order_written(steps):
    view, feed, clock = make(terminal=False)
    events: list[Any] = []
    for stream, text, then in steps:
        feed(stream, text)
        if then == "tick":
            clock.now += 0.3
        if then != "none":
            events += view.take()
    feed.finish()
    events += view.take()
    written = [(stream, char) for stream, text, _ in steps for char in text]
    assert [(e.name, char) for e in events for char in e.text] == written


# -- the stdin channel ------------------------------------------------------------------------------

@pytest.mark.unit
def test_a_reply_answers_its_own_request_or_the_open_one_but_never_an_abandoned_one():
    reply = {"msg_type": "input_reply", "parent_header": {"msg_id": "r2"}, "content": {"value": "x"}}
    assert answers(reply, "r2", ["r1"])
    assert not answers(reply | {"parent_header": {"msg_id": "r1"}}, "r2", ["r1"])
    assert answers(reply | {"parent_header": {}}, "r2", ["r1"])  # the console's jupyter_client sends none
    assert not answers(reply | {"msg_type": "execute_request"}, "r2", [])
    assert not answers(None, "r2", [])


@pytest.fixture
def stdin_pair():
    """The kernel's stdin ROUTER socket and a frontend's DEALER socket, connected in process."""
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.bind("inproc://stdin")
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, b"frontend")
    dealer.connect("inproc://stdin")
    session = Session(key=b"secret")
    try:
        yield session, router, dealer
    finally:
        dealer.close(0)
        router.close(0)
        context.term()


def _frontend_answers(session: Session, dealer: zmq.Socket, value: str, seen: list[dict[str, Any]],
                      stale_first: bool = False) -> threading.Thread:
    def run() -> None:
        if not dealer.poll(5000):
            return
        _, request = session.recv(dealer, mode=0)
        assert request is not None
        seen.append(request)
        if stale_first:  # an answer to an earlier, abandoned request comes in first
            session.send(dealer, "input_reply", {"value": "stale"}, parent={"header": {"msg_id": "old"},
                                                                           "msg_id": "old"})
        session.send(dealer, "input_reply", {"value": value}, parent=request)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    return worker


@pytest.mark.unit
def test_the_channel_asks_the_frontend_and_returns_its_answer(stdin_pair):
    session, router, dealer = stdin_pair
    channel = StdinChannel(session, lambda: router)
    seen: list[dict[str, Any]] = []
    worker = _frontend_answers(session, dealer, "Ada", seen)
    parent = session.msg("execute_request", {"code": "read"})
    value = channel.ask("Your name? ", False, parent, [b"frontend"], threading.Event())
    worker.join(5)
    assert value == "Ada"
    assert seen[0]["msg_type"] == "input_request"
    assert seen[0]["content"] == {"prompt": "Your name? ", "password": False}
    assert seen[0]["parent_header"]["msg_id"] == parent["header"]["msg_id"]


@pytest.mark.unit
def test_an_answer_to_an_abandoned_request_is_passed_over(stdin_pair):
    session, router, dealer = stdin_pair
    channel = StdinChannel(session, lambda: router)
    channel._asked.append("old")
    seen: list[dict[str, Any]] = []
    worker = _frontend_answers(session, dealer, "fresh", seen, stale_first=True)
    value = channel.ask("x? ", True, session.msg("execute_request", {}), [b"frontend"], threading.Event())
    worker.join(5)
    assert value == "fresh" and seen[0]["content"]["password"] is True


@pytest.mark.unit
def test_a_cancelled_wait_ends_at_once_and_the_next_request_goes_out(stdin_pair, monkeypatch):
    session, router, dealer = stdin_pair
    channel = StdinChannel(session, lambda: router)
    cancelled = threading.Event()
    result: list[str | None] = []
    looks: list[bool] = []  # for each look at the socket, whether the wait was cancelled by then
    select = zmq.select
    monkeypatch.setattr(zmq, "select", lambda *args: looks.append(cancelled.is_set()) or select(*args))
    waiter = threading.Thread(target=lambda: result.append(
        channel.ask("never? ", False, session.msg("execute_request", {}), [b"frontend"], cancelled)))
    waiter.start()
    assert dealer.poll(5000)
    first = session.recv(dealer, mode=0)[1]
    assert first is not None and first["content"]["prompt"] == "never? "
    cancelled.set()
    waiter.join(5)
    assert result == [None] and not waiter.is_alive()
    assert sum(looks) <= 1  # at once: at most one more look at the socket after the cancel (each is POLL_SECONDS)
    session.send(dealer, "input_reply", {"value": "late"}, parent=first)  # the user answers the old box
    seen: list[dict[str, Any]] = []
    worker = _frontend_answers(session, dealer, "now", seen)
    assert channel.ask("again? ", False, session.msg("execute_request", {}), [b"frontend"],
                       threading.Event()) == "now"
    worker.join(5)


# -- a cell's prompts --------------------------------------------------------------------------------

class FakeFrontend:
    """`ask` answers from a list (None: the user never answers, the wait ends when cancelled)."""

    def __init__(self, answers_: list[str | None]) -> None:
        self.answers = list(answers_)
        self.asked: list[tuple[str, bool]] = []
        self.sent: list[dict[str, Any]] = []

    def ask(self, prompt: str, password: bool, cancelled: threading.Event) -> str | None:
        value = self.answers.pop(0)
        self.asked.append((prompt, password))  # after the pop: once asked, the next prompt gets the next answer
        if value is None:
            cancelled.wait(10)
        return value

    def send_input(self, params: dict[str, Any]) -> None:
        self.sent.append(params)


@pytest.mark.unit
def test_an_answer_is_written_to_the_terminal_and_ctrl_d_is_end_of_input():
    frontend = FakeFrontend(["Ada", EOF])
    prompts = CellPrompts(True, frontend.ask, frontend.send_input)
    prompts.wanted("a? ", False)
    assert prompts.join()
    prompts.wanted("b? ", True)
    assert prompts.join()
    assert frontend.asked == [("a? ", False), ("b? ", True)]
    assert frontend.sent == [{"text": "Ada"}, {"eof": True}]


@pytest.mark.unit
def test_without_stdin_a_read_gets_end_of_input_and_nobody_is_asked():
    frontend = FakeFrontend([])
    prompts = CellPrompts(False, frontend.ask, frontend.send_input)
    prompts.wanted("a? ", False)
    assert prompts.join()
    assert frontend.asked == [] and frontend.sent == [{"eof": True}]


@pytest.mark.unit
def test_closing_abandons_the_open_prompt_and_sends_nothing():
    frontend = FakeFrontend([None])
    prompts = CellPrompts(True, frontend.ask, frontend.send_input)
    prompts.wanted("a? ", False)
    wait_until(lambda: frontend.asked, patience(10), "the prompt to be asked")
    prompts.close()
    assert prompts.join(2)
    assert frontend.sent == []


@pytest.mark.unit
def test_a_new_prompt_abandons_the_one_before():
    frontend = FakeFrontend([None, "second"])
    prompts = CellPrompts(True, frontend.ask, frontend.send_input)
    prompts.wanted("first? ", False)
    wait_until(lambda: frontend.asked, patience(10), "the first prompt to be asked")
    prompts.wanted("second? ", False)
    assert prompts.join(2)
    assert frontend.sent == [{"text": "second"}]


# -- the kernel's cell loop, against a fake runner client ----------------------------------------------
# Until the sandbox speaks the terminal protocol, these stand a scripted fake in for the runner client
# (and its sandbox): `shell.run` plays a script of `shell.output` / `shell.input_wanted` frames on a
# thread, as the client's pump would deliver them, and `shell.input` / `shell.interrupt` feed the
# script. The kernel object is real (no sockets but the stdin pair above); what it would send on
# iopub is recorded.

class FakeCall(Future):
    """A call in flight, a future of its result as the real one (`host.client.Call`)."""

    def __init__(self, request_id: str, on_notification: Any) -> None:
        super().__init__()
        self.request_id = request_id
        self.on_notification = on_notification

    def settle(self, value: dict[str, Any]) -> None:
        if not self.done():
            self.set_result(value)


class FakeBox:
    """The runner client, the sandbox and its provider in one, running `script(box, call)` as the command."""

    def __init__(self, script: Any) -> None:
        self.script = script
        self.ready = True
        self.cwd = "/tmp"
        self.enforcement = "bwrap"
        self.run_params: dict[str, Any] = {}
        self.inputs: list[dict[str, Any]] = []
        self.input_came = threading.Condition()
        self.interrupted = threading.Event()
        self.offset = 0
        self.whole: list[tuple[str, str]] = []
        self.call_obj: FakeCall | None = None

    # the sandbox
    @property
    def client(self) -> FakeBox:
        return self

    @property
    def provider(self) -> FakeBox:
        return self

    def wait(self, _timeout: float = 0) -> FakeBox:
        return self

    def limit_counters(self) -> dict[str, int]:
        return {}

    def limit_report(self) -> None:
        return None

    def network_state(self) -> None:
        return None

    def folder_of(self, _shell: str) -> str:
        return self.cwd

    def remember_folder(self, _shell: str, _folder: str | None) -> None:
        pass

    def headline(self) -> list[str]:
        return ["fake"]

    # the client
    def start_call(self, method: str, params: dict[str, Any], on_notification: Any = None) -> FakeCall:
        if method == "shell.interrupt":
            self.interrupted.set()
            return FakeCall("interrupt", None)
        assert method == "shell.run"
        self.run_params = params
        call = self.call_obj = FakeCall("run-1", on_notification)
        threading.Thread(target=self.script, args=(self, call), daemon=True).start()
        return call

    def call(self, method: str, params: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        assert method == "shell.input"
        with self.input_came:
            self.inputs.append(params)
            self.input_came.notify_all()
        return {}

    # for scripts
    def out(self, call: FakeCall, stream: str, text: str) -> None:
        call.on_notification({"method": "shell.output", "id": call.request_id, "shell": "main", "stream": stream,
                              "text": text, "offset": self.offset})
        self.offset += len(text)
        self.whole.append((stream, text))

    def want(self, call: FakeCall, prompt: str, password: bool = False) -> None:
        call.on_notification({"method": "shell.input_wanted", "id": call.request_id, "shell": "main",
                              "prompt": prompt, "password": password})

    def next_input(self, count: int, timeout: float = 10) -> dict[str, Any] | None:
        with self.input_came:
            self.input_came.wait_for(lambda: len(self.inputs) >= count or self.interrupted.is_set(), timeout)
            return self.inputs[count - 1] if len(self.inputs) >= count else None

    def end(self, call: FakeCall, **result: Any) -> None:
        output = "".join(text for _, text in self.whole)
        call.settle({"output": output, "exit_code": 0, "segments": [[s, len(t)] for s, t in self.whole], **result})


@pytest.fixture
def fake_kernel(stdin_pair, monkeypatch):
    """A real OwSandboxKernel with a fake box (given later) and the stdin pair; what it sends is recorded."""
    from owsandbox.kernel import kernel as kernel_module

    session, router, dealer = stdin_pair
    monkeypatch.setattr(kernel_module.Sandbox, "start_in_background", lambda self: None)
    kernel = kernel_module.OwSandboxKernel(session=session)
    kernel.stdin = StdinChannel(session, lambda: router)
    sent: list[tuple[float, str, dict[str, Any]]] = []
    kernel._send_raw = lambda parent, msg_type, content: sent.append((time.monotonic(), msg_type, content))  # type: ignore[method-assign]

    def run(script: Any, code: str = "cell", allow_stdin: bool = True) -> tuple[FakeBox, str | None]:
        box = FakeBox(script)
        kernel.sandbox = box  # type: ignore[assignment]
        parent = session.msg("execute_request", {"code": code})
        stdin = kernel_module._CellStdin(allow_stdin, [b"frontend"])
        error: str | None = None
        try:
            asyncio.run(asyncio.wait_for(kernel._run_cell(parent, "main", code, stdin), 20))
        except kernel_module.CellError as err:
            error = err.ename
        return box, error

    yield kernel, run, sent, session, dealer


def _streams(sent: list[tuple[float, str, dict[str, Any]]]) -> list[tuple[str, str]]:
    return [(c["name"], c["text"]) for _, kind, c in sent if kind == "stream"]


def test_the_kernel_asks_the_frontend_and_writes_the_answer_to_the_terminal(fake_kernel):
    kernel, run, sent, session, dealer = fake_kernel

    def script(box: FakeBox, call: FakeCall) -> None:
        box.out(call, "stdout", "Your name? ")
        box.want(call, "Your name? ")
        given = box.next_input(1)
        assert given is not None
        box.out(call, "stdout", f"hello {given['text']}\n")
        box.end(call)

    seen: list[dict[str, Any]] = []
    frontend = _frontend_answers(session, dealer, "Ada", seen)
    box, error = run(script)
    frontend.join(5)
    assert error is None
    assert seen[0]["content"] == {"prompt": "Your name? ", "password": False}
    assert box.inputs == [{"shell": "main", "text": "Ada"}]
    assert _streams(sent) == [("stdout", "hello Ada\n")]
    params = box.run_params
    assert (params["terminal"], params["stdin"], params["cols"], params["rows"], params["stderr"]) == \
        (True, True, 120, 50, "apart")


def test_a_cell_without_stdin_says_so_and_answers_a_stray_prompt_with_end_of_input(fake_kernel):
    kernel, run, sent, session, dealer = fake_kernel

    def script(box: FakeBox, call: FakeCall) -> None:
        box.want(call, "")
        box.next_input(1)
        box.end(call)

    box, error = run(script, allow_stdin=False)
    assert error is None and box.run_params["stdin"] is False
    assert box.inputs == [{"shell": "main", "eof": True}]
    assert not dealer.poll(100)  # nobody was asked


def test_stop_during_a_prompt_ends_the_wait_and_the_next_prompt_is_asked(fake_kernel):
    kernel, run, sent, session, dealer = fake_kernel

    def script(box: FakeBox, call: FakeCall) -> None:
        box.out(call, "stdout", "waiting? ")
        box.want(call, "waiting? ")
        if dealer.poll(5000):  # the input request reached the frontend: now Stop
            kernel._interrupt_running()
        box.interrupted.wait(10)
        box.end(call, exit_code=None, outcome="interrupt", error="interrupted by user")

    started = time.monotonic()
    box, error = run(script)
    assert error == "Interrupted" and time.monotonic() - started < 5
    request = session.recv(dealer, mode=0)[1]
    assert request is not None and request["content"]["prompt"] == "waiting? "
    session.send(dealer, "input_reply", {"value": "too late"}, parent=request)  # answered after Stop
    assert box.inputs == []

    def again(box: FakeBox, call: FakeCall) -> None:
        box.want(call, "again? ")
        given = box.next_input(1)
        box.out(call, "stdout", f"[{given['text'] if given else ''}]\n")
        box.end(call)

    seen: list[dict[str, Any]] = []
    frontend = _frontend_answers(session, dealer, "fresh", seen)
    box, error = run(again)
    frontend.join(5)
    assert error is None and box.inputs == [{"shell": "main", "text": "fresh"}]
    assert _streams(sent)[-1] == ("stdout", "[fresh]\n")


def test_an_unfinished_line_shows_on_its_own_after_a_moment_and_order_is_kept(fake_kernel):
    kernel, run, sent, session, dealer = fake_kernel

    shown_alone: list[bool] = []

    def script(box: FakeBox, call: FakeCall) -> None:
        box.out(call, "stdout", "abc")
        box.out(call, "stderr", "x\n")
        box.out(call, "stdout", "progress")
        # The line ends only once the notebook was shown its start (held a moment, not until the end).
        with suppress(WaitTimeout):
            shown_alone.append(wait_until(lambda: ("stdout", "progress") in _streams(sent), 10,
                                          "the unfinished line on its own"))
        box.out(call, "stdout", " done\n")
        box.end(call)

    run(script, allow_stdin=False)
    assert shown_alone == [True]
    assert _streams(sent) == [("stdout", "abc"), ("stderr", "x\n"), ("stdout", "progress"), ("stdout", " done\n")]


def test_each_shell_runs_with_its_own_terminal_settings(fake_kernel):
    kernel, run, sent, session, dealer = fake_kernel
    from owsandbox.kernel.magics.shells import terminal_settings

    terminal_settings(kernel.settings, "main").terminal = False
    terminal_settings(kernel.settings, "main").stderr = "merge"

    def script(box: FakeBox, call: FakeCall) -> None:
        box.out(call, "stdout", "\x1b[K\x07raw\n")
        box.end(call)

    box, _ = run(script, allow_stdin=False)
    assert (box.run_params["terminal"], box.run_params["stderr"]) == (False, "merge")
    assert _streams(sent) == [("stdout", "\x1b[K\x07raw\n")]  # off a terminal: exact
