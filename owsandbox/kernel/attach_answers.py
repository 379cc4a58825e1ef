"""Answers to `%send`: a record sent with an `id` waits for the program's answer with that id.

The kernel decides what an answer is, not the channel: the first later record with the same `id`
that is not an event (no `method`, and no `type` among event, progress, notification, log). The
channel only holds a future per id (`register_request`, `complete_request`, `fail_request`); every
method here runs on the attach loop, except `cancel`, which hands its work to it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from .errors import AttachError

if TYPE_CHECKING:
    from ..channel import ExecdJsonLineChannel
    from .attach_loop import AttachLoop

EVENT_TYPES = frozenset({"event", "progress", "notification", "log"})


def is_answer(record: dict[str, Any], request_id: Any) -> bool:
    return (record.get("id") == request_id and "method" not in record
            and record.get("type") not in EVENT_TYPES)


class Answers:
    """The ids of one program's records that still wait for their answer."""

    def __init__(self) -> None:
        self.waiting: set[Any] = set()

    def offer(self, channel: ExecdJsonLineChannel, record: dict[str, Any]) -> None:
        """A record arrived: it completes the wait it answers, if any."""
        for request_id in list(self.waiting):
            if is_answer(record, request_id) and channel.complete_request(request_id, record):
                self.waiting.discard(request_id)

    async def exchange(self, channel: ExecdJsonLineChannel, records: list[dict[str, Any]], wait: float,
                       who: str) -> list[Any]:
        """Send `records`; return the answers to those with an `id`, in order, within `wait` seconds."""
        futures = []
        for record in records:
            if "id" in record:
                if record["id"] in self.waiting:
                    raise AttachError(f"a record with id {record['id']!r} is still waiting for its answer")
                futures.append(channel.register_request(record["id"]))
                self.waiting.add(record["id"])
        for record in records:
            await channel.send(record)
        if not futures:
            return []
        try:
            return list(await asyncio.wait_for(asyncio.gather(*futures), wait))
        except asyncio.TimeoutError:
            for record in records:
                self.waiting.discard(record.get("id"))
                if "id" in record:
                    channel.fail_request(record["id"], AttachError("gave up"))
            raise AttachError(f"no answer from {who} within {wait:g} s "
                              "(records keep arriving in its display)") from None

    def cancel(self, channel: ExecdJsonLineChannel, loop: AttachLoop) -> None:
        """Stop: every wait gives up now (from any thread)."""
        for request_id in list(self.waiting):
            self.waiting.discard(request_id)
            loop.call_soon(channel.fail_request, request_id, AttachError("interrupted by user"))
