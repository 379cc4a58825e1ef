"""The host's side of a runner session, without I/O: which daemon it talks to, what has arrived, what
it acknowledged, and the calls in flight; and the one decision a new pipe needs.

When a pipe is (re)opened and the box has said hello, the host must decide, and decide the same way
whatever the pipe is: the same daemon instance means *resume* (ask for the answers after the last
contiguous seq, send again every call not yet answered: the daemon runs a request id at most once);
another instance means the box *restarted*: every call already sent may or may not have run, so it
fails with `RunnerRestarted` rather than being run twice, and only calls never sent go out. `adopt`
makes that decision from the hello alone. `RunnerClient` holds one `Session` under its lock and does
the reading, the writing and the threads.

The session also owns each shell's folder: the one fact about a shell that must outlive the box's
daemon. It is learnt from each `shell.run` result (`cwd`, the folder bash was left in), forgotten by
`shell.close`, and sent as `cwd` with every `shell.run`, so that a shell the box has to start (after
`exit`, or in a restarted box that knows nothing) starts where it was.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import protocol as P

if TYPE_CHECKING:
    from .client import Call


class SeqTracker:
    """The highest seq up to which every answer has arrived, for `session.resume` and acks."""

    def __init__(self, start: int = 0) -> None:
        self.contiguous = start
        self._above: set[int] = set()

    def saw(self, seq: int) -> bool:
        """Record `seq`; False when it was seen before (a replayed duplicate)."""
        if seq <= self.contiguous or seq in self._above:
            return False
        self._above.add(seq)
        while self.contiguous + 1 in self._above:
            self.contiguous += 1
            self._above.discard(self.contiguous)
        return True


@dataclass
class Adoption:
    """What to do with a pipe whose box said `hello`."""

    kind: str  # "first" (a new session), "resume" (the same daemon) or "restarted" (another one)
    resume_from: int | None = None  # for "resume": ask for what came after this seq
    lost: list[Call] = field(default_factory=list)  # for "restarted": fail these, their outcome is unknown
    send: list[Call] = field(default_factory=list)  # (re)send these, now marked as sent to this instance


class Session:
    def __init__(self) -> None:
        self.instance_id: str | None = None
        self.seqs = SeqTracker()
        self.acked = 0
        self.restarts = 0
        self.calls: dict[str, Call] = {}
        self.folders: dict[str, str] = {}  # each shell's folder after its last command, by name

    def adopt(self, hello: dict[str, Any], first: bool) -> Adoption:
        new_instance = hello.get("instance_id")
        if first or self.instance_id is None:
            adoption = Adoption("first")
            self._start(new_instance, hello)
        elif new_instance == self.instance_id:
            adoption = Adoption("resume", resume_from=self.seqs.contiguous)
        else:
            adoption = Adoption("restarted")
            self.restarts += 1
            self._start(new_instance, hello)
            adoption.lost = [call for call in self.calls.values() if call.sent_to is not None]
            for call in adoption.lost:
                del self.calls[call.request_id]
        for call in self.calls.values():
            if not call.done():
                call.sent_to = self.instance_id
                adoption.send.append(call)
        return adoption

    def _start(self, instance_id: Any, hello: dict[str, Any]) -> None:
        self.instance_id = instance_id
        self.seqs = SeqTracker(int(hello.get("last_seq") or 0))
        self.acked = self.seqs.contiguous

    def answered(self, message: dict[str, Any]) -> Call | None:
        """The call an answer settles, taken out of flight; None for a duplicate (a replay of an
        answer already delivered) or an answer nobody waits for."""
        seq = message.get("seq")
        if isinstance(seq, int) and not self.seqs.saw(seq):
            return None
        return self.calls.pop(message.get("id"), None)  # type: ignore[arg-type]

    def run_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """`shell.run`'s params, with the shell's folder as `cwd` once the session knows it (the caller's
        `cwd` is where a shell starts that has never run here)."""
        folder = self.folders.get(params.get("shell") or "main")
        return {**params, "cwd": folder} if folder else params

    def ran(self, result: Any) -> None:
        """A `shell.run` result (already parsed as its shape): the folder its shell was left in."""
        if result.get("cwd"):
            self.folders[result["shell"]] = result["cwd"]

    def closed(self, shell: str) -> None:
        """`shell.close` ended the shell: the next one of its name starts afresh."""
        self.folders.pop(shell, None)

    def ack_due(self) -> int | None:
        """The seq to acknowledge now, if answers arrived since the last ack."""
        if self.seqs.contiguous <= self.acked:
            return None
        self.acked = self.seqs.contiguous
        return self.acked

    @property
    def unacked(self) -> bool:
        return self.seqs.contiguous > self.acked

    def fail_all(self, error: P.RunnerError) -> None:
        """Every call in flight fails with `error` (the client was closed, the box is gone)."""
        calls, self.calls = list(self.calls.values()), {}
        for call in calls:
            call.settle(error=error)
