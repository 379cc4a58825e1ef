"""`%send`'s waits: a request waits for its answer, within a timeout that progress resets; Stop cancels.

Which record answers which is the conversation's business (`conversation.py`, by `jsonrpc.py`'s
rules): a JSON-RPC request waits for the response with its id; a notification or a response (the
answer to the program's own request) is sent without waiting; a record of another protocol waits
when it has an `id`. The channel only holds a future per waiting call (`register_request`,
`complete_request`, `fail_request`), so a channel that fails fails every wait at once.

The timeout is the longest silence allowed, not a total: each progress notification for the call
(MCP's `notifications/progress` with the request's progressToken, LSP's `$/progress`, ACP's
`session/update`) gives it the whole timeout again, as MCP asks of clients. A request that times
out, or that Stop gives up on, is cancelled in the dialect's own words (MCP `notifications/cancelled`,
LSP `$/cancelRequest`, ACP `session/cancel`), and the error says what was sent. Every method here
runs on the attach loop, except `cancel`, which hands its work to it.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import AttachError
from . import jsonrpc as R
from .conversation import SENT, Call, Conversation, Entry
from .jsonrpc_errors import JsonRpcError, ToolError, from_error

if TYPE_CHECKING:
    from ...channel import ExecdJsonLineChannel
    from .loop import AttachLoop


class NoAnswer(AttachError):
    """No answer within the timeout (and no progress for that long)."""

    ename = "TimedOut"


class SendInterrupted(AttachError):
    """Stop while a %send waited for its answer."""

    ename = "Interrupted"


class Talk(Protocol):
    """What a wait needs of its program (attach.Program)."""

    conversation: Conversation

    def describe(self) -> str: ...
    def changed(self) -> None: ...  # the view has news


@dataclass(eq=False)
class Waiter:
    call: Call
    future: asyncio.Future[Any]
    timeout: float
    deadline: float  # loop time


def named(call: Call, who: str) -> str:
    """How a message names a call: `request 3 (tools/call) to #1 server`."""
    method = f" ({call.method})" if call.method else ""
    return f"request {json.dumps(call.id, ensure_ascii=False)}{method} to {who}"


def _channel_key(call: Call) -> tuple[str, Any]:
    return ("call", R.id_key(call.id))


class Answers:
    """The calls of one program that a cell waits for."""

    def __init__(self) -> None:
        self.waiting: dict[Call, Waiter] = {}

    def offer(self, channel: ExecdJsonLineChannel, entry: Entry) -> None:
        """A record arrived (and the conversation matched it): it ends the wait it answers, or gives
        the wait it advances its whole timeout again."""
        call = entry.call
        waiter = self.waiting.get(call) if call is not None else None
        if waiter is None or call is None:
            return
        if call.answer is entry:
            del self.waiting[call]
            channel.complete_request(_channel_key(call), entry)
        elif call.progress is entry:
            waiter.deadline = asyncio.get_running_loop().time() + waiter.timeout

    async def exchange(self, channel: ExecdJsonLineChannel, talk: Talk, records: list[dict[str, Any]],
                       timeout: float | None) -> list[Entry]:
        """Send `records` in order, then wait for the answer to each request among them (each within
        `timeout` of its last news; None: not at all); the entries sent, their calls' answers filled in."""
        sent, waiters = await self.post(channel, talk, records, timeout or 0.0)
        if timeout is not None:
            await self.wait(channel, talk, waiters)
        else:
            for waiter in waiters:
                self._drop(channel, waiter)
        return sent

    async def post(self, channel: ExecdJsonLineChannel, talk: Talk, records: list[dict[str, Any]],
                   timeout: float) -> tuple[list[Entry], list[Waiter]]:
        """Send `records` in order; a waiter for each request among them, its `timeout` running."""
        conversation = talk.conversation
        ids: set[tuple[str, Any]] = set()
        for record in records:
            if R.waits_for_answer(record):
                key = R.id_key(record.get("id"))
                if key in ids or conversation.pending_call(record.get("id")) is not None:
                    raise AttachError(f"a request with id {json.dumps(record.get('id'))} is still waiting for its "
                                      "answer; give this one another id")
                ids.add(key)
        loop = asyncio.get_running_loop()
        sent: list[Entry] = []
        waiters: list[Waiter] = []
        for record in records:
            entry = conversation.sent(record, time.time())
            sent.append(entry)
            call = entry.call
            if call is not None and call.asked_by == SENT:
                waiter = Waiter(call, channel.register_request(_channel_key(call)), timeout, loop.time() + timeout)
                self.waiting[call] = waiter
                waiters.append(waiter)
            try:
                await channel.send(record)
            except BaseException as exc:
                entry.failed = str(exc) or type(exc).__name__
                for waiter in waiters:
                    self._drop(channel, waiter)
                talk.changed()
                raise
        talk.changed()
        return sent, waiters

    async def wait(self, channel: ExecdJsonLineChannel, talk: Talk, waiters: list[Waiter]) -> None:
        """Wait for each waiter's answer in turn; the first that fails (no answer in time, Stop, the
        channel's end) raises, and nobody waits for the others any more."""
        try:
            for waiter in waiters:
                await self._wait(channel, talk, waiter)
        finally:
            for waiter in waiters:
                if waiter.call in self.waiting:
                    self._drop(channel, waiter)

    async def _wait(self, channel: ExecdJsonLineChannel, talk: Talk, waiter: Waiter) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if waiter.future.done():
                waiter.future.result()  # raises the channel's failure, or Stop's
                return
            left = waiter.deadline - loop.time()
            if left > 0:
                await asyncio.wait({waiter.future}, timeout=left)
                continue
            self._drop(channel, waiter)
            call = waiter.call
            silence = (f"{waiter.timeout:g} s of its last progress notification ({call.progress_count} came)"
                       if call.progress_count else f"{waiter.timeout:g} s (no progress notification came for it)")
            told = await self.send_cancel(channel, talk, call, "timed out in the notebook")
            raise NoAnswer(f"no answer to {named(call, talk.describe())} within {silence}; {told}. A late answer "
                           "still shows in the program's view")

    def _drop(self, channel: ExecdJsonLineChannel, waiter: Waiter) -> None:
        self.waiting.pop(waiter.call, None)
        channel.fail_request(_channel_key(waiter.call), AttachError("gave up"))
        if waiter.future.done() and not waiter.future.cancelled():
            waiter.future.exception()  # retrieved, so that asyncio does not warn that nobody did

    async def send_cancel(self, channel: ExecdJsonLineChannel, talk: Talk, call: Call, reason: str) -> str:
        """Tell the program a call is given up, in its dialect; the words that say what was sent."""
        conversation = talk.conversation
        request = call.request.record or {}
        cancel = conversation.dialect.cancel(request, reason) if R.is_jsonrpc(request) else None
        if cancel is None:
            if not R.is_jsonrpc(request):
                return f"nothing was sent to {talk.describe()} (its records are not JSON-RPC: no cancel is known)"
            return (f"no cancel was sent ({conversation.dialect.title} has none for {call.method or 'it'}; "
                    "%attach --dialect mcp|lsp|acp names the program's dialect)")
        entry = conversation.sent(cancel, time.time())
        conversation.cancelled(call, entry)
        try:
            await channel.send(cancel)
        except BaseException as exc:  # noqa: BLE001 - said in the cell's error instead
            entry.failed = str(exc) or type(exc).__name__
            talk.changed()
            return f"the cancel ({cancel['method']}) could not be sent: {entry.failed}"
        talk.changed()
        return f"sent {cancel['method']} {json.dumps(cancel.get('params', {}), ensure_ascii=False)}"

    def cancel(self, channel: ExecdJsonLineChannel, talk: Talk, loop: AttachLoop) -> None:
        """Stop (from any thread): every wait ends now, each call cancelled in the program's dialect."""
        if not self.waiting:
            return

        async def give_up() -> None:
            for call in list(self.waiting):
                self.waiting.pop(call, None)
                told = await self.send_cancel(channel, talk, call, "the user pressed Stop in the notebook")
                channel.fail_request(_channel_key(call), SendInterrupted(
                    f"stopped waiting for the answer to {named(call, talk.describe())}; {told}"))

        loop.submit(give_up())


def error_in(call: Call, dialect_codes: dict[int, type[JsonRpcError]], tool_error: Any,
             who: str) -> JsonRpcError | None:
    """The cell's error when `call`'s answer is an error answer: an `error` member, or a tool's failure
    (MCP's `result.isError: true`, which `tool_error` of the dialect reads); None for a good answer."""
    answer = call.answer.record if call.answer is not None else None
    if answer is None or R.kind_of(answer) != R.RESPONSE:
        return None
    error = R.error_of(answer)
    if error is not None:
        return from_error(error, dialect_codes, named(call, who))
    why = tool_error(answer)
    if why is None:
        return None
    request = call.request.record or {}
    params = request.get("params") if isinstance(request.get("params"), dict) else {}
    tool = params.get("name") if isinstance(params, dict) else None
    return ToolError(None, f"the tool {json.dumps(tool)} failed: {why}" if isinstance(tool, str) else why, None,
                     named(call, who))
