"""The host decides from its own records, and whatever the box feeds the kernel is data, bounded.

Each test is the attack, through a real kernel on the default sandbox (bubblewrap):

* the `%attach` registry is a file in the box: an entry naming a host address (TCP or a Unix
  socket) must not make the kernel connect there;
* a program's records, however large and nested, keep the kernel's memory bounded;
* a display id given by `owdisplay --id` never reaches the kernel's own displays;
* a display the kernel cannot parse (nested a million deep) is a note, and the command runs on,
  stoppable;
* `%record` writes no terminal control of the box into its `.cast` file;
* lines the box writes to its stderr (the daemon's log pipe) are shown as the box's.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..conftest import DEFAULT_KERNEL_NAME, require_bwrap
from ..kernel_session import KernelSession
from ..waiting import patience, wait_until

REGISTRY = "/run/owsandbox/run/attach.json"  # the attach registry, as the box sees it (box/daemon.py)


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[KernelSession]:
    require_bwrap()
    session = KernelSession(tmp_path, kernel_name=DEFAULT_KERNEL_NAME)
    try:
        yield session
    finally:
        session.close()


class Listener:
    """A host endpoint that counts who connects: TCP on 127.0.0.1 or a Unix socket in a host folder."""

    def __init__(self, family: int, address: object) -> None:
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind(address)
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture
def host_endpoints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Listener, Listener]]:
    tcp = Listener(socket.AF_INET, ("127.0.0.1", 0))
    folder = tmp_path_factory.mktemp("host-socket")
    unix = Listener(socket.AF_UNIX, str(folder / "host.sock"))
    try:
        yield tcp, unix
    finally:
        tcp.close()
        unix.close()


def forge_registry(kernel: KernelSession, url: str) -> None:
    """A cell rewrites the box's attach registry: every entry now names `url` as its endpoint."""
    forged = kernel.run(f"""python3 - <<'EOF'
import json
entries = json.load(open("{REGISTRY}"))["sessions"]
for entry in entries:
    entry["url"] = {json.dumps(url)}
json.dump({{"sessions": entries}}, open("{REGISTRY}", "w"))
EOF""")
    assert forged.status == "ok", forged.outputs


def test_a_registry_entry_naming_a_host_address_is_never_connected_to(kernel: KernelSession, host_endpoints) -> None:
    tcp, unix = host_endpoints
    urls = [f"http://127.0.0.1:{tcp.sock.getsockname()[1]}", f"unix:{unix.sock.getsockname()}"]
    started = kernel.run("%attach --name victim -- sleep 120")
    assert started.status == "ok", started.outputs
    assert kernel.run("%detach").status == "ok"
    forge_registry(kernel, urls[0])
    again = kernel.run("%attach --last")  # this kernel attached it at the box's endpoint: it goes there again
    assert again.status == "ok" and "attached again to #1" in again.text(), again.outputs
    assert kernel.run("%detach").status == "ok"
    # A new kernel knows nothing of its own: only the box's file names an address.
    kernel.km.restart_kernel(now=False)
    kernel.kc.wait_for_ready(timeout=60)
    kernel.drain()
    session = kernel.run("%attach --list").of_type("display_data")[0]["data"]["text/plain"].splitlines()[1].split()[1]
    for url in urls:
        forge_registry(kernel, url)
        for how in ("%attach --last", f"%attach --session {session}"):
            refused = kernel.run(how)
            assert refused.status == "error", refused.outputs
            assert "does not connect to an address read from the sandbox" in refused.error["evalue"]
    time.sleep(0.5)
    assert tcp.connections == 0 and unix.connections == 0
    given = kernel.run(f"%attach --last --url {urls[0]}")  # the user's own --url is the user's decision
    assert given.status == "error" and tcp.connections > 0, given.outputs


def displays(run) -> list[dict]:
    """The displays of a cell that have an id (the kernel's notes have none)."""
    return [m for m in run.outputs if m["msg_type"] in ("display_data", "update_display_data")
            and m["content"].get("transient", {}).get("display_id")]


def test_a_box_display_id_cannot_update_the_kernels_own_view(kernel: KernelSession) -> None:
    started = kernel.run("%attach --name watched -- sleep 120")
    assert started.status == "ok", started.outputs
    view = [m["content"]["transient"]["display_id"] for m in displays(started)]
    assert view and view[0].startswith("owsandbox-attach-")
    forged = kernel.run(f"""printf '# forged\\n' > fake.md
SID=$(python3 -c 'import json; print(json.load(open("{REGISTRY}"))["sessions"][-1]["session_id"])')
owdisplay fake.md --id "owsandbox-attach-$SID-1"
owdisplay fake.md --id "owsandbox-attach-$SID-1" """)
    assert forged.status == "ok", forged.outputs
    shown = displays(forged)
    assert len(shown) == 2 and "forged" in shown[0]["content"]["data"]["text/plain"], forged.outputs
    ids = {m["content"]["transient"]["display_id"] for m in shown}
    assert view[0] not in ids and len(ids) == 1  # its own id, still its own: the second is an update of the first
    assert [m["msg_type"] for m in shown] == ["display_data", "update_display_data"]
    kernel.run("%attach --kill")


@pytest.mark.parametrize("depth", [100_000, 1_000_000])
def test_a_display_nested_too_deep_is_a_note_and_stop_still_reaches_the_command(kernel: KernelSession,
                                                                                depth: int) -> None:
    made = kernel.run(f"python3 -c 'open(\"deep.json\", \"w\").write(\"[\" * {depth} + \"]\" * {depth})'")
    assert made.status == "ok", made.outputs
    msg_id = kernel.send("owdisplay deep.json; echo after-the-display; sleep 60")
    kernel.wait_for(lambda m: m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "stream"
                    and "after-the-display" in m["content"]["text"], 30, "the command going on")
    kernel.control("interrupt_request", {})
    run = kernel.collect(msg_id, timeout=30)
    assert run.status == "error" and run.error["ename"] == "Interrupted", run.outputs
    assert not any(m["msg_type"] == "error" and m["content"]["ename"] == "KernelError" for m in run.outputs)
    assert kernel.run("echo still-here").text() == "still-here\n"


# -- the parsers of box data, fed the box's worst -------------------------------------------------

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.unit
def test_every_parser_of_box_data_turns_deep_nesting_into_its_own_error() -> None:
    from owsandbox.kernel.attach.asked import auto_answer
    from owsandbox.kernel.attach.registry import checked_entry
    from owsandbox.kernel.attach.replay import parse
    from owsandbox.kernel.display.rich import rich_bundle
    from owsandbox.kernel.errors import UsageError
    from owsandbox.kernel.teaching.recording import CastError, read_cast

    with pytest.raises(UsageError, match="nests deeper"):
        rich_bundle(DEEP.encode(), "application/json", "deep.json")
    assert rich_bundle(("[" * 150 + "]" * 150).encode(), "application/json", "d.json").keys() == {"text/plain"}
    with pytest.raises(UsageError):
        auto_answer("m", "a.json", DEEP)
    with pytest.raises(UsageError):
        parse(DEEP, "saved.jsonl")
    for cast in ([DEEP], ['{"version": 2}', DEEP], ['{"version": 2}', "5"], ['{"version": 2}', '["x", "o", "d"]']):
        with pytest.raises(CastError):
            read_cast(cast)
    assert checked_entry({"session_id": "../x"}) is None
    assert checked_entry({"session_id": "ab-12", "cursor": True, "name": "n" * 10_000, "number": -3,
                          "url": "unix:/x"}) == {"session_id": "ab-12", "cursor": 0, "name": "n" * 200,
                                                 "url": "unix:/x"}


@pytest.mark.unit
def test_box_display_ids_never_meet_the_kernels_and_are_bounded() -> None:
    from owsandbox.kernel.display.rich import KEEP_BOX_IDS, BoxDisplayIds

    ids = BoxDisplayIds()
    made = ids.box_id("owsandbox-attach-x-1")
    assert made is not None and not made.startswith("owsandbox-attach-")
    assert ids.box_id("") is None and len(ids.box_id("x" * 10_000) or "") < 100
    assert not ids.seen(made) and ids.seen(made)
    for n in range(KEEP_BOX_IDS + 5):
        ids.seen(f"owsandbox-box-{n}")
    assert len(ids._seen) == KEEP_BOX_IDS


CONTROLS = {"OSC 52 (clipboard)": "\x1b]52;c;", "a title report": "\x1b[21t", "DCS": "\x1bP", "OSC (title)": "\x1b]0;",
            "C1 CSI": "\x9b"}


@pytest.mark.parametrize("terminal", ["on", "off"])
def test_a_recording_holds_no_terminal_control_of_the_box(kernel: KernelSession, tmp_path: Path,
                                                          terminal: str) -> None:
    cast = tmp_path.parent / f"{tmp_path.name}-{terminal}.cast"  # outside the workspace: the host's file
    assert kernel.run(f"%record on {cast}").status == "ok"
    assert kernel.run(f"%terminal {terminal}").status == "ok"
    ran = kernel.run(r"""printf 'before\e]52;c;ZWNobyBwd25lZA==\aafter\n'; printf 'title\e[21t\e]0;owned\a\n'
printf 'sixel\ePq#0;2;0;0;0#0~~\e\\ done\n'; printf '\xc2\x9b21t c1\n'; printf '\e[1;31mred\e[0m\n'""")
    assert ran.status == "ok", ran.outputs
    assert kernel.run("%record off").status == "ok"
    from owsandbox.kernel.teaching.recording import read_cast

    text = cast.read_text(encoding="utf-8")
    _, events = read_cast(text.splitlines())
    shown = "".join(data for _, _, data in events)
    assert "before" in shown and "after" in shown and "\x1b[1;31mred" in shown  # colours stay
    for what, control in CONTROLS.items():
        assert control not in shown, f"{what} reached the .cast file"
    cast.unlink()


FLOOD = """import json, sys
huge = '{"a": [' + '{},' * 2_400_000 + '{}]}'   # 7 MiB: about 180 MB as Python objects
for n in range(6):
    sys.stdout.write(huge + "\\n"); sys.stdout.flush()
large = '{"id": %d, "a": [' + '{},' * 80_000 + '{}]}'   # 240 KiB: parsed, about 6 MB each
for n in range(80):
    sys.stdout.write(large % n + "\\n"); sys.stdout.flush()
print(json.dumps({"type": "done"}), flush=True)
sys.stdin.read()
"""
RSS_GROWTH_MIB = 200  # the kernel's own memory may grow this much while a program floods %attach


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.fixture
def small_box_kernel(tmp_path: Path) -> Iterator[KernelSession]:
    require_bwrap()
    session = KernelSession(tmp_path, kernel_name=DEFAULT_KERNEL_NAME, env={"OWSANDBOX_LIMITS": "memory=256M"})
    try:
        yield session
    finally:
        session.close()


def test_a_flood_of_large_nested_records_keeps_the_kernel_small(small_box_kernel: KernelSession,
                                                                tmp_path: Path) -> None:
    kernel = small_box_kernel
    (tmp_path / "flood.py").write_text(FLOOD)
    assert kernel.run("echo warm").status == "ok"
    kernel.run("%attach -- sleep 1")  # the attach machinery loaded before the baseline
    kernel.run("%attach --kill")
    pid = kernel.km.provisioner.process.pid
    before = rss_mib(pid)
    started = kernel.run("%attach --name flood -- python3 flood.py")
    assert started.status == "ok", started.outputs
    highest = before
    deadline = time.monotonic() + 120
    done = False
    while time.monotonic() < deadline and not done:
        records = kernel.run("%records --type done").text()
        done = '"done"' in records
        highest = max(highest, rss_mib(pid))
        time.sleep(0.5)
    assert done, kernel.run("%records --last 3").text()[-2000:]
    highest = max(highest, rss_mib(pid))
    print(f"kernel RSS: {before:.0f} MiB before, {highest:.0f} MiB at most during the flood")
    assert highest - before < RSS_GROWTH_MIB, (before, highest)
    assert kernel.run("%output rate off").status == "ok"  # megabytes of records, read whole: no server between
    shown = kernel.run("%records --last 90").text()
    assert '"owsandbox:cut": {"bytes": 7200011, "start": 0, "end": 7200012}' in shown  # the huge ones, said by size
    kernel.run("%attach --kill")


@pytest.mark.unit
def test_a_line_too_large_to_parse_is_its_head_and_the_conversation_keeps_a_bounded_size(monkeypatch) -> None:
    from owsandbox.channel.execdws import STDOUT, encode_frame
    from owsandbox.channel.jsonlines import CUT_KEY, JsonLineDecoder, Record
    from owsandbox.kernel.attach import conversation as C

    huge = b'{"jsonrpc": "2.0", "result": {"a": [' + b"{}," * 200_000 + b'{}]}, "id": 9}\n'
    events = JsonLineDecoder(flag_non_json=True).feed(encode_frame(STDOUT, huge))
    assert len(events) == 1 and isinstance(events[0], Record)
    record = events[0].value
    assert record["id"] == 9 and record["jsonrpc"] == "2.0" and record["result"].endswith("not kept)")
    assert record[CUT_KEY] == {"bytes": len(huge) - 1, "start": 0, "end": len(huge)}
    array = b"[" + b"{}," * 200_000 + b"{}]\n"  # too large, and no object: text, never parsed
    assert type(JsonLineDecoder(flag_non_json=True).feed(encode_frame(STDOUT, array))[0]).__name__ == "NotJsonLine"

    monkeypatch.setattr(C, "KEEP_RECORD_COST", 4 << 20)
    talk = C.Conversation()
    for n in range(40):
        talk.received({"id": n, "a": [{} for _ in range(2_000)]}, float(n))
    assert talk.kept_cost <= C.KEEP_RECORD_COST
    oldest, newest = talk.records[0].record, talk.records[-1].record
    assert oldest["id"] == 0 and C.CUT_KEY in oldest and oldest["a"].endswith("not kept)")
    assert len(newest["a"]) == 2_000 and C.CUT_KEY not in newest
    line = talk.stdout_text("x" * 1_000_000, 1.0)
    assert len(line.text or "") < C.STDERR_LINE_CHARS + 100


def test_lines_the_box_writes_to_the_daemons_log_are_marked_as_the_boxs(attacker) -> None:
    from owsandbox.host.logpump import BOX_MARK, DROPPED

    state = attacker.step(state=True)["state_dir"]
    log = Path(state) / "daemon.log"
    forged = "[owsandbox: the host checked this sandbox: all is well]"
    tried = [attacker.run(f"printf '%s\\n' 'FORGED-{n} {forged}' > /proc/{pid}/fd/2")
             for n, pid in enumerate((1, 2, "self"))]
    attacker.run("printf 'FORGED-cr\\r%s\\n' " + repr(forged) + " > /proc/1/fd/2")
    wait_until(lambda: "FORGED" in log.read_text(errors="replace"), patience(10), "a forged line in the daemon's log",
               interval=0.1)
    text = log.read_bytes()
    reached = [line for line in text.splitlines() if b"FORGED" in line or b"all is well" in line]
    assert reached and all(line.startswith(BOX_MARK) for line in reached), (tried, reached)
    assert all(line.startswith(BOX_MARK) or line + b"\n" == DROPPED for line in text.splitlines() if line), text[-2000:]


@pytest.mark.unit
def test_box_lines_are_marked_however_the_chunks_fall() -> None:
    from owsandbox.host.logpump import BOX_MARK, BoxLines

    stream = b"one\ntwo\r\nthree\rfour\n\nfive"
    for cut in range(len(stream) + 1):
        lines = BoxLines()
        marked = lines.mark(stream[:cut]) + lines.mark(stream[cut:])
        assert marked.split(b"\n") == [BOX_MARK + word for word in (b"one", b"two", b"three", b"four", b"", b"five")]


def test_a_record_nested_near_pythons_limit_reaches_no_client(kernel: KernelSession, tmp_path: Path) -> None:
    """965 levels parse on the kernel's attach thread, and the message that shows them is one that a
    Python client (jupyter_client, so nbclient and jupyter console) cannot decode: kept 100 deep."""
    (tmp_path / "deep.py").write_text(
        "import json, sys\n"
        "print('{\"id\": \"deep\", \"a\": ' + '[' * 965 + ']' * 965 + '}', flush=True)\n"
        "for line in sys.stdin:\n"
        "    print('{\"id\": %d, \"deep\": ' % json.loads(line)['id'] + '[' * 965 + ']' * 965 + '}', flush=True)\n")
    started = kernel.run("%attach --name deep -- python3 deep.py")
    assert started.status == "ok", started.outputs
    answered = kernel.run('%send {"id": 2, "type": "x"}')
    assert answered.status == "ok", answered.error
    records = kernel.run("%records")
    assert records.status == "ok" and "nested deeper than 100 levels" in records.text(), records.outputs
    assert kernel.run("%attach --kill").status == "ok"


def test_completions_and_help_from_the_box_are_bounded(kernel: KernelSession) -> None:
    name = "flood" + "x" * 100
    made = kernel.run(f"for i in $(seq 3000); do eval \"{name}$i() {{ :; }}\"; done; "
                      f"eval \"{name}long$(printf 'y%.0s' $(seq 5000))() {{ :; }}\"; "
                      f"helped() {{ :; }}; eval \"helped() {{ : $(printf 'z%.0s' $(seq 300000)); }}\"")
    assert made.status == "ok", made.outputs
    kernel.kc.complete(name, len(name))
    matches = kernel.kc.get_shell_msg(timeout=30)["content"]["matches"]
    assert 0 < len(matches) <= 1000 and all(len(match) <= 4096 for match in matches), len(matches)
    kernel.kc.inspect("helped", 6)
    reply = kernel.kc.get_shell_msg(timeout=30)["content"]
    assert reply["found"] and len(reply["data"]["text/plain"]) <= 100_100, len(reply["data"]["text/plain"])
