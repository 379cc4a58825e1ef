"""Delivery rules across breaks: resume, run-once, restarts, relays that outlive their client."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from owsandbox import protocol as P
from owsandbox.host.client import RunnerClient
from owsandbox.host.executor import RunnerExecutor
from owsandbox.host.providers.local import LocalProvider

from .conftest import box_with_release
from .daemon_restart import restart_daemon
from .processes import wait_for_file
from .test_runner_shells import run_in_background, wait_until_busy
from .waiting import patience, shell_waits_for, wait_until


@pytest.fixture(params=["local", "bwrap", "ssh", "opensandbox", "opensandbox-release", "opensandbox-external"])
def box(request: pytest.FixtureRequest, zipapp, workspace):
    """conftest's `box`, and through a released execd as well (release mode)."""
    yield from box_with_release(request, zipapp, workspace)


def test_a_cut_pipe_resumes_and_the_answer_made_while_away_arrives(box, workspace):
    _, client = box
    ex = RunnerExecutor(client, cwd=str(workspace))
    ex.run("cd /tmp && export STAYS=yes")
    instance = client.instance_id
    go = workspace / "go"  # made after the cut: the answer cannot have left on the pipe that is cut
    worker, result = run_in_background(
        lambda: ex.run(f"{shell_waits_for(go, interval=0.02)}; echo finished-while-cut"))
    wait_until_busy(client)
    client.cut()  # the relay dies mid-command, as a dropped connection would
    go.touch()
    worker.join(30)
    assert result["output"] == "finished-while-cut\n" and result["exit_code"] == 0
    assert client.instance_id == instance and client.restarts == 0 and client.reconnects == 1
    assert ex.run("echo $STAYS $PWD")["output"] == "yes /tmp\n"


def test_many_cuts_lose_and_repeat_nothing(box, workspace):
    _, client = box
    ex = RunnerExecutor(client, cwd=str(workspace), shell="counter")
    results = []
    for i in range(12):
        # each command waits for the test's word to go on, so the cut surely lands while it runs (a
        # fixed 0.1 s could end before a loaded machine's first look saw it busy)
        command = f"{shell_waits_for(f'go-{i}', interval=0.01)}; echo {i} >> count.txt; echo {i}"
        worker, result = run_in_background(lambda command=command: ex.run(command))
        if i % 2 == 0:
            wait_until_busy(client, "counter")
            client.cut()
        (workspace / f"go-{i}").touch()
        worker.join(30)
        results.append(result["output"])
    assert results == [f"{i}\n" for i in range(12)]
    assert (workspace / "count.txt").read_text() == "".join(f"{i}\n" for i in range(12))


def test_a_request_id_sent_three_times_runs_once(box, workspace):
    _, client = box
    target = workspace / "runs.txt"
    frame = P.encode(P.request("fixed-id", "shell.run", {"command": f"echo ran >> {target}; sleep 0.3"}))
    call = client.start_call("shell.run", {"command": "true"})  # an ordinary call to wait on afterwards
    client.wait(call, 10)
    for _ in range(3):
        client._transport.send(frame)
    wait_for_file(target)  # it started: it has ended before the call below is answered
    done = client.call("shell.run", {"shell": "after", "command": "sleep 0.5; echo later"}, timeout=10)
    assert done["output"] == "later\n"
    for _ in range(2):  # and again after it finished: the kept answer is sent, nothing runs
        client._transport.send(frame)
    assert client.call("shell.run", {"command": "cat runs.txt"}, timeout=10)["output"] == "ran\n"


def test_a_restarted_daemon_fails_the_running_command_as_unknown(box, workspace):
    provider, client = box
    (workspace / "deep").mkdir()
    ex = RunnerExecutor(client, cwd=str(workspace))
    ex.run("cd deep && export LOST=1")
    worker, result = run_in_background(lambda: ex.run("sleep 30"))
    wait_until_busy(client)
    restart_daemon(provider)
    worker.join(30)
    assert "outcome of this command is unknown" in result["error"]
    assert result["exit_code"] is None
    assert client.restarts == 1
    assert ex.run("echo [$LOST] ${PWD##*/}")["output"] == "[] deep\n"  # variables gone, folder kept


def test_the_newest_connection_wins(pipe_box, workspace):
    """(Through execd the relay is a remote session: test_provider_opensandbox checks it there.)"""
    provider, client = pipe_box
    old = client._transport
    second = provider.open_runner()
    try:
        second.send(P.encode(P.request("h2", "runner.hello", {"protocol_version": 1})))
        answer = json.loads(second.read().split(b"\n")[0])
        assert answer["result"]["instance_id"] == client.instance_id
        old.proc.wait(10)  # the daemon closed the older pipe, so its relay left
    finally:
        second.close()
    # The client noticed, came back, and works.
    assert RunnerExecutor(client).run("echo back")["output"] == "back\n"


def test_a_relay_nobody_talks_to_leaves_by_itself(zipapp, workspace):
    provider = LocalProvider(cwd=workspace, runner_path=zipapp)
    provider.create()
    try:
        relay = subprocess.Popen(
            [sys.executable, "-S", str(zipapp), "attach", "--socket", provider.socket_path, "--silence-seconds", "0.5"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert relay.wait(timeout=10) == 0
        assert b"silent" in relay.stderr.read()
        relay.stdin.close()
        relay.stdout.close()
        relay.stderr.close()
    finally:
        provider.destroy()


def test_a_relay_that_cannot_connect_exits_2_and_says_why(zipapp, tmp_path):
    done = subprocess.run([sys.executable, "-S", str(zipapp), "attach", "--socket", str(tmp_path / "none.sock")],
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    assert done.returncode == 2
    assert done.stdout == b"" and b"cannot connect" in done.stderr


def test_the_relay_leaves_when_its_stdin_closes(pipe_box):
    """(execd cannot close a session's stdin; there the relay leaves when its session is deleted,
    checked in test_provider_opensandbox.)"""
    provider, _ = pipe_box
    relay = provider.open_runner()
    relay.proc.stdin.close()
    assert relay.proc.wait(10) == 0
    relay.close()


def test_a_client_that_cannot_reach_the_sandbox_fails_loudly(tmp_path):
    from owsandbox.host.transport import PipeTransport

    client = RunnerClient(lambda: PipeTransport(["sh", "-c", "echo no such box >&2; exit 255"]),
                          reconnect_timeout=0.5)
    with pytest.raises(P.RunnerError) as err:
        client.connect()
    assert err.value.code == P.RUNNER_UNREACHABLE and "no such box" in err.value.message
    client.close()


def test_banners_before_the_frames_are_dropped(zipapp, workspace):
    """A provider's login noise on the pipe must not break the stream."""
    from owsandbox.host.transport import PipeTransport

    provider = LocalProvider(cwd=workspace, runner_path=zipapp)
    provider.create()
    try:
        argv = ["sh", "-c", 'echo "Welcome to the box"; echo "[1,2]"; printf "\\377\\n"; exec "$@"', "sh",
                sys.executable, "-S", str(zipapp), "attach", "--socket", provider.socket_path]
        client = RunnerClient(lambda: PipeTransport(argv))
        client.connect()
        assert RunnerExecutor(client).run("echo through")["output"] == "through\n"
        client.close()
    finally:
        provider.destroy()


def test_the_daemon_socket_is_private(box):
    provider, _ = box
    folder = os.path.dirname(provider.socket_path)
    assert os.stat(folder).st_mode & 0o777 == 0o700
    assert os.stat(provider.socket_path).st_mode & 0o777 == 0o600


def test_the_daemon_leaves_with_its_parent(zipapp, tmp_path):
    """The parent starts the daemon with --exit-with-parent, prints its pid and dies."""
    script = (
        "import subprocess, sys\n"
        f"p = subprocess.Popen([sys.executable, '-S', {str(zipapp)!r}, 'serve',"
        f" '--socket', {str(tmp_path / 's' / 'sock')!r},"
        " '--exit-with-parent'], stdout=subprocess.PIPE, start_new_session=True)\n"
        "print(p.stdout.readline().decode().strip(), flush=True)\n"
    )
    parent = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    pid = json.loads(parent.stdout)["pid"]
    wait_until(lambda: not os.path.exists(f"/proc/{pid}") or _state(pid) == "Z", 10,
               f"the daemon {pid} to leave with its parent", interval=0.05)
    assert not (tmp_path / "s" / "sock").exists()


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


# -- bad input: a clear error, and the daemon keeps serving -------------------------------------

def raw_call(sock_path: str, frames: list[bytes], answers: int) -> list[dict]:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(sock_path)
        sock.sendall(b"".join(frames))
        reader = sock.makefile("rb")
        got: list[dict] = []
        while len(got) < answers:  # the answers, not the live frames (a run's output may come as one first)
            message = json.loads(reader.readline())
            if "id" in message or "method" not in message:
                got.append(message)
        return got


def test_bad_requests_get_clear_errors(box):
    provider, client = box
    client.close()  # talk to the daemon directly
    answers = raw_call(provider.socket_path, [
        P.encode(P.request("m", "no.such", {})),
        P.encode(P.request("p", "shell.run", {"shell": "main"})),
        P.encode(P.request("t", "shell.run", {"command": 5})),
        P.encode({"jsonrpc": "2.0", "id": "o", "method": "fs.read", "params": [1]}),
        P.encode(P.request("i", "shell.interrupt", {"shell": "nope"})),
        b"not json at all\n",
        P.encode(P.request("ok", "shell.run", {"command": "echo alive"})),
    ], 6)
    by_id = {a["id"]: a for a in answers}
    assert by_id["m"]["error"]["code"] == P.METHOD_NOT_FOUND and "no.such" in by_id["m"]["error"]["message"]
    assert by_id["p"]["error"] == {"code": P.INVALID_PARAMS, "message": "missing param 'command'"}
    assert by_id["t"]["error"]["code"] == P.INVALID_PARAMS
    assert "'command' must be a string" in by_id["t"]["error"]["message"]
    assert by_id["o"]["error"]["code"] == P.INVALID_PARAMS
    assert by_id["i"]["error"]["code"] == P.UNKNOWN_SHELL
    assert by_id["ok"]["result"]["output"] == "alive\n"


def test_a_frame_over_the_limit_is_refused_by_id_and_nothing_runs(zipapp, workspace):
    provider = LocalProvider(cwd=workspace, runner_path=zipapp, daemon_args=["--max-frame-bytes", "4096"])
    provider.create()
    try:
        huge = P.encode(P.request("big", "shell.run", {"command": "touch made-it; : " + "x" * 10000}))
        after = P.encode(P.request("next", "shell.run", {"command": "echo fine"}))
        answers = raw_call(provider.socket_path, [huge, after], 2)
        assert answers[0]["id"] == "big" and answers[0]["error"]["code"] == P.INVALID_REQUEST
        assert "larger than the limit of 4096 bytes" in answers[0]["error"]["message"]
        assert answers[1]["result"]["output"] == "fine\n"
        assert not (workspace / "made-it").exists()
        # The client refuses to send such a frame in the first place.
        client = RunnerClient(provider.open_runner)
        client.connect()
        with pytest.raises(P.RunnerError, match="larger than the runner's limit"):
            client.call("shell.run", {"command": "x" * 10000}, timeout=5)
        client.close()
    finally:
        provider.destroy()


def test_an_answer_no_longer_kept_is_reported_not_rerun(box, workspace):
    provider, client = box
    client.close()
    target = workspace / "once.txt"
    frame = P.encode(P.request("gone", "shell.run", {"command": f"echo x >> {target}"}))
    first = raw_call(provider.socket_path, [frame], 1)[0]
    ack = P.encode(P.notification("session.ack", {"seq": first["seq"]}))
    again = raw_call(provider.socket_path, [ack, frame], 1)[0]
    assert again["error"]["code"] == P.UNKNOWN_TASK and "no longer kept" in again["error"]["message"]
    assert target.read_text() == "x\n"


def test_resume_replays_what_was_not_acknowledged(box, workspace):
    provider, client = box
    client.close()
    requests = [P.encode(P.request(f"r{i}", "shell.run", {"shell": f"s{i}", "command": f"echo {i}"})) for i in range(3)]
    answers = sorted(raw_call(provider.socket_path, requests, 3), key=lambda a: a["seq"])
    assert all(a["result"]["output"] == f"{a['id'][1:]}\n" for a in answers)
    first = answers[0]["seq"]
    replayed = raw_call(provider.socket_path, [P.encode(P.notification("session.ack", {"seq": first})),
                                               P.encode(P.request("res", "session.resume", {"last_seq": first}))], 3)
    assert [r.get("id") for r in replayed] == [answers[1]["id"], answers[2]["id"], "res"]
    assert replayed[2]["result"]["replayed"] == 2 and replayed[2]["result"]["gap"] is False


def test_interrupt_is_answered_while_the_shell_is_busy(box):
    _, client = box
    ex = RunnerExecutor(client)
    worker, _ = run_in_background(lambda: ex.run("sleep 20"))
    wait_until_busy(client)
    started = time.monotonic()
    answer = client.call("shell.interrupt", {"shell": "main"}, timeout=5)
    assert answer == {"shell": "main", "interrupted": True, "state": "running"}
    assert time.monotonic() - started < patience(1)  # answered, not held until the `sleep 20` ended
    worker.join(10)
    assert not worker.is_alive()


def test_a_thread_per_call_is_safe(box):
    _, client = box
    outputs: dict[int, str] = {}

    def one(i: int) -> None:
        outputs[i] = client.call("shell.run", {"shell": f"s{i}", "command": f"echo {i}"}, timeout=30)["output"]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outputs == {i: f"{i}\n" for i in range(8)}


def test_forward_relays_a_request_and_its_whole_answer_after_stdin_ends(zipapp, workspace):
    """`forward` carries one connection to the execd endpoint: stdin may end before the answer comes."""
    provider = LocalProvider(cwd=workspace, runner_path=zipapp)
    provider.create()
    client = RunnerClient(provider.open_runner)
    try:
        execd = client.connect()["execd"]
        request = f"GET /pty HTTP/1.1\r\nHost: box\r\nX-EXECD-ACCESS-TOKEN: {execd['token']}\r\n\r\n".encode()
        done = subprocess.run([sys.executable, "-S", str(zipapp), "forward", "--socket", execd["unix_socket"]],
                              input=request, capture_output=True, timeout=30)
        assert done.returncode == 0
        assert done.stdout.startswith(b"HTTP/1.1 200") and b'"sessions"' in done.stdout
    finally:
        client.close()
        provider.destroy()


def test_a_large_request_while_output_floods_in_does_not_hang(zipapp, workspace):
    """Writing a big request must never wait on the pump: the pump drains the pipe the write needs."""
    provider = LocalProvider(cwd=workspace, runner_path=zipapp)
    provider.create()
    client = RunnerClient(provider.open_runner)
    try:
        client.connect()
        flowing = threading.Event()
        flood = client.start_call("shell.run",
                                  {"shell": "flood", "command": "yes 0123456789abcdef | head -c 300000000"},
                                  on_notification=lambda _frame: flowing.set())
        assert flowing.wait(30)
        written = client.call("fs.write", {"path": "big.txt", "text": "y" * 30_000_000}, timeout=120)
        assert written["bytes_written"] == 30_000_000
        assert client.wait(flood, 120)["output_bytes"] == 300_000_000
    finally:
        client.close()
        provider.destroy()
