"""What the bubblewrap sandbox keeps out: writes outside the workspace, home secrets, the network,
and processes that outlive it. (The whole runner suite also runs inside it: see the `box` fixture.)"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import uuid

import pytest

from owsandbox.host.providers.bwrap import BwrapProvider
from owsandbox.host.providers.local import descendants, pid_alive
from owsandbox.host.workspace import RunnerWorkspace, open_workspace

from .conftest import require_bwrap


@pytest.fixture
def sandbox(zipapp, workspace):
    require_bwrap()
    ws = RunnerWorkspace(BwrapProvider(cwd=workspace, runner_path=zipapp), str(workspace))
    try:
        yield ws
    finally:
        ws.close()


def test_the_workspace_is_writable_and_lands_on_the_host(sandbox, workspace):
    done = sandbox.executor.run("echo made-inside > result.txt && mkdir -p sub && touch sub/x")
    assert done["exit_code"] == 0
    assert (workspace / "result.txt").read_text() == "made-inside\n" and (workspace / "sub" / "x").exists()


def test_nothing_outside_the_workspace_can_be_written(sandbox, workspace):
    outside = workspace.parent / f"outside-{uuid.uuid4().hex}.txt"
    done = sandbox.executor.run(f"touch {outside} /etc/owsandbox-probe /usr/owsandbox-probe; echo status=$?")
    assert "Read-only file system" in done["output"] and not outside.exists()
    assert not os.path.exists("/etc/owsandbox-probe")
    private = sandbox.executor.run("echo secret > /tmp/private-note && cat /tmp/private-note")
    assert private["output"] == "secret\n" and not os.path.exists("/tmp/private-note")


def test_home_folder_secrets_are_not_visible(sandbox):
    home = os.path.expanduser("~")
    probe = os.path.join(home, ".ssh", f"owsandbox-probe-{uuid.uuid4().hex}")
    made_ssh = not os.path.isdir(os.path.dirname(probe))
    os.makedirs(os.path.dirname(probe), exist_ok=True)
    try:
        with open(probe, "w") as f:
            f.write("private key material")
        done = sandbox.executor.run(f"cat {probe}; ls -A ~ ~/.ssh")
        assert "private key material" not in done["output"] and "No such file" in done["output"]
        assert "ls: cannot access '" + home + "/.ssh'" in done["output"]  # the folder itself is not there
    finally:
        os.unlink(probe)
        if made_ssh:
            with contextlib.suppress(OSError):  # another test run's probe may be in it now: it removes the folder
                os.rmdir(os.path.dirname(probe))


def _listening_port() -> tuple[socket.socket, int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)

    def accept() -> None:
        try:
            while True:
                conn, _ = server.accept()
                conn.close()
        except OSError:
            return

    threading.Thread(target=accept, daemon=True).start()
    return server, server.getsockname()[1]


CONNECT = ("python3 -c 'import socket,sys; socket.create_connection((\"127.0.0.1\", int(sys.argv[1])), 3); "
           "print(\"reached\")' {}")


def test_there_is_no_network_unless_asked(zipapp, workspace):
    require_bwrap()
    server, port = _listening_port()
    try:
        closed = RunnerWorkspace(BwrapProvider(cwd=workspace, runner_path=zipapp), str(workspace))
        try:
            done = closed.executor.run(CONNECT.format(port))
            assert done["exit_code"] != 0 and "reached" not in done["output"]
            assert closed.describe()["network"] == "none"
        finally:
            closed.close()
        opened = RunnerWorkspace(BwrapProvider(cwd=workspace, runner_path=zipapp, network=True), str(workspace))
        try:
            # Network on means out, not in: the box has a route out but not the host's loopback services.
            assert opened.describe()["network"] == "outbound"
            routes = opened.executor.run("cat /proc/net/route")["output"].splitlines()[1:]
            assert any(line.split()[1] == "00000000" for line in routes), routes  # a default route
            done = opened.executor.run(CONNECT.format(port))
            assert done["exit_code"] != 0 and "reached" not in done["output"]
        finally:
            opened.close()
    finally:
        server.close()


def test_processes_are_gone_after_the_sandbox_closes(zipapp, workspace):
    require_bwrap()
    ws = RunnerWorkspace(BwrapProvider(cwd=workspace, runner_path=zipapp), str(workspace))
    ws.executor.run("sleep 600 & disown; echo started")
    bwrap_pid = ws.provider.daemon_pid
    inside = descendants(bwrap_pid)
    assert len(inside) >= 3  # the daemon, a shell, the sleep
    ws.close()
    assert [pid for pid in inside + [bwrap_pid] if pid_alive(pid)] == []


def test_the_sandbox_describes_its_mounts(sandbox, workspace):
    info = sandbox.describe()
    assert info["enforcement"] == "bubblewrap" and info["network"] == "none"
    assert info["mounts"][str(workspace)].startswith("read-write") and info["mounts"]["/usr"] == "read-only"
    assert "/" not in info["mounts"] and "/home" not in info["mounts"] and "/run" in info["mounts"]


def test_auto_chooses_bubblewrap_where_it_works(workspace):
    require_bwrap()
    ws = open_workspace(workspace)  # no provider named: auto
    try:
        assert ws.describe()["provider"] == "bwrap"
        assert ws.executor.run("hostname")["output"] == "sandbox\n"
    finally:
        ws.close()


@pytest.mark.unit
def test_an_older_bubblewrap_still_makes_an_unprivileged_box(monkeypatch, workspace):
    """Before 0.8 there is no --disable-userns, before 0.6 no --size: the options are left out (the box
    stays in a user namespace with no capabilities) and %sandbox says what is missing."""
    from owsandbox.host.providers import bwrap

    monkeypatch.setattr(bwrap, "bwrap_options", lambda: frozenset({"--unshare-user", "--cap-drop", "--tmpfs"}))
    kept = bwrap.supported(["bwrap", "--unshare-user", "--disable-userns", "--cap-drop", "ALL", "--size", "100",
                            "--tmpfs", "/tmp"])
    assert kept == ["bwrap", "--unshare-user", "--cap-drop", "ALL", "--tmpfs", "/tmp"]
    provider = BwrapProvider(cwd=workspace)
    assert provider.describe()["mounts"]["/tmp"] == "private (bubblewrap before 0.6: any size)"
    assert "cannot forbid further user namespaces" in provider.describe()["privileges"]


def test_a_home_workspace_with_this_users_state_folder_in_its_cache_starts(zipapp, tmp_path, monkeypatch):
    """A notebook in the home, where one of this user's runtime folders (`~/.cache/owsandbox/run`) is:
    the home's `.cache` is hidden, and the state folder inside it was hidden a second time, which
    bubblewrap could not mount ("Can't remount readonly on .../.cache/owsandbox/run")."""
    require_bwrap()
    home = tmp_path / "home"
    state = home / ".cache" / "owsandbox" / "run"
    state.mkdir(parents=True, mode=0o700)
    (home / "notes.txt").write_text("kept\n")
    monkeypatch.setenv("HOME", str(home))
    ws = RunnerWorkspace(BwrapProvider(cwd=home, runner_path=zipapp), str(home))
    try:
        done = ws.executor.run("cat notes.txt; ls -A .cache | wc -l")
        assert done["exit_code"] == 0 and done["output"] == "kept\n0\n", done
    finally:
        ws.close()
