"""Code in a cell tries to get out of its sandbox; each test is one attack, run as root and as a plain
user, and each asserts the attack failed and the host is as it was."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from owsandbox.box.procstat import namespace_pids

from ..machine_lock import own_key
from ..processes import command_line
from ..waiting import wait_until
from .conftest import Attacker


def test_a_link_in_place_of_the_log_cannot_reach_host_files(attacker: Attacker, home: Path):
    state = attacker.step(state=True)["state_dir"]
    bashrc = (home / ".bashrc").read_text()
    tried = attacker.run(f"ls {state}; ln -sf {home}/.bashrc {state}/daemon.log; echo planted >> {state}/daemon.log")
    assert tried["exit_code"] != 0 and "No such file" in tried["output"]
    attacker.run("kill -9 2")  # the daemon: the host starts a new one, writing its log
    assert attacker.run("echo back")["output"].endswith("back\n")
    assert (home / ".bashrc").read_text() == bashrc
    assert not os.path.islink(os.path.join(state, "daemon.log"))


def test_no_privileges_inside_even_when_root_starts_it(attacker: Attacker, home: Path):
    caps = attacker.run("grep CapEff /proc/self/status")["output"]
    assert caps.split()[-1] == "0000000000000000", caps
    for attempt in ("mount -o remount,rw,bind /usr", "mount -o remount,rw /", f"umount {home}",
                    "mount -t tmpfs none /mnt", "unshare -Ur true", "unshare -m true", "touch /etc/owned",
                    "touch /usr/owned", "chroot / true"):
        done = attacker.run(attempt)
        assert done["exit_code"] != 0, (attempt, done)
    assert not os.path.exists("/etc/owned") and not os.path.exists("/usr/owned")
    assert "PRIVATE" not in attacker.run(f"cat {home}/.ssh/id_ed25519")["output"]


def test_the_host_never_kills_a_pid_the_box_names(attacker: Attacker):
    victim = subprocess.Popen(["sleep", "300"])
    try:
        attacker.run(f"echo {victim.pid} > /run/owsandbox/run/shells.pids; echo {victim.pid} >> shells.pids")
        attacker.step(close=True)
        assert victim.poll() is None, "the host killed a process the box named"
    finally:
        victim.kill()
        victim.wait()


def test_after_a_restart_shutdown_ends_the_sandbox_and_removes_its_state(attacker: Attacker):
    before = attacker.step(state=True)
    attacker.step(restart=True)
    after = attacker.step(state=True)
    assert after["init_pid"] != before["init_pid"]
    attacker.run("setsid sleep 300 & (sleep 301 &) ; echo ok")
    attacker.step(close=True)
    wait_until(lambda: not _in_namespace(after["pidns"]), 5, "the sandbox's processes to end", interval=0.1)
    assert not os.path.exists(after["state_dir"])


def _in_namespace(pidns: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.readlink(f"/proc/{name}/ns/pid") == pidns:
                    found.append(int(name))
            except OSError:
                continue
    return found


def test_a_workspace_that_is_home_still_hides_its_secrets(attacker_factory, home: Path):
    attacker = attacker_factory()
    attacker.start(home)
    for secret in (".ssh/id_ed25519", ".aws/credentials"):
        shown = attacker.run(f"cat {home}/{secret}")
        assert shown["exit_code"] != 0 and "SECRET" not in shown["output"] and "PRIVATE" not in shown["output"]
    assert attacker.run(f"echo evil > {home}/.ssh/authorized_keys")["exit_code"] != 0
    assert attacker.run(f"echo evil >> {home}/.bashrc")["exit_code"] != 0
    assert (home / ".bashrc").read_text() == "# the user's own\n"
    assert attacker.run(f"echo mine > {home}/project/notes.txt")["exit_code"] == 0  # the workspace is writable
    mounts = attacker.step(describe=True)["mounts"]
    assert mounts[f"{home}/.ssh"].startswith("hidden") and mounts[str(home)].startswith("top level read-only")


def test_a_workspace_of_the_whole_machine_is_refused(attacker_factory):
    attacker = attacker_factory()
    answer = attacker.step(start={"cwd": "/", "runner_path": attacker.runner})
    assert "workspace cannot be /" in answer.get("error", ""), answer


def test_a_workspace_that_holds_the_private_runtime_folder_moves_it_and_hides_it(attacker_factory, owner):
    """The runtime folder holds the sockets, the logs and the runner the host runs for every relay: a
    box whose workspace held it (a notebook opened in /tmp, say) could make the host run its code. The
    sandbox's state goes elsewhere, and the folder shows empty and read-only in the box."""
    runtime = Path(tempfile.mkdtemp(prefix="owsbx-xdg-"))
    os.chown(runtime, owner.pw_uid, owner.pw_gid)
    os.chmod(runtime, 0o700)
    private = runtime / f"owsandbox-{owner.pw_uid}"
    private.mkdir(mode=0o700)
    (private / "runners").mkdir()
    for folder in (private, private / "runners"):
        os.chown(folder, owner.pw_uid, owner.pw_gid)
    try:
        attacker = attacker_factory(XDG_RUNTIME_DIR=str(runtime))
        attacker.start(runtime)
        assert not attacker.step(state=True)["state_dir"].startswith(str(runtime))
        assert attacker.run(f"ls -A {private}")["output"] == ""
        assert attacker.run(f"touch {private}/runners/runner-x.pyz")["exit_code"] != 0
        assert list((private / "runners").iterdir()) == []
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


def test_other_sandboxes_and_the_runtime_folder_are_out_of_reach(attacker_factory, home: Path, who: str, owner):
    runtime = Path(tempfile.mkdtemp(prefix="owsbx-xdg-"))
    os.chown(runtime, owner.pw_uid, owner.pw_gid)
    os.chmod(runtime, 0o700)
    try:
        first, second = attacker_factory(XDG_RUNTIME_DIR=str(runtime)), attacker_factory(XDG_RUNTIME_DIR=str(runtime))
        first.start(home / "project", key=own_key("kernel-one"), linger_seconds=5)
        second.start(home / "project", key=own_key("kernel-two"), linger_seconds=5)
        other = second.step(state=True)["state_dir"]
        assert other.startswith(str(runtime))
        probe = first.run(f"ls {runtime} >/dev/null 2>&1 && echo LISTED; python3 -c \"import socket; "
                          f"s=socket.socket(socket.AF_UNIX); s.connect('{other}/run/runner.sock'); print('REACHED')\"")
        assert "LISTED" not in probe["output"] and "REACHED" not in probe["output"], probe
        assert first.run("ls /run")["output"].split() == ["owsandbox"]  # no user runtime folder, no D-Bus
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


def test_the_boxs_init_shows_no_host_paths(attacker: Attacker):
    """bubblewrap's init is the box's pid 1: its command line would list every host path the box was
    made of (the private state folder, the runner's place, what is hidden), so it reads them from a
    file descriptor instead."""
    state = attacker.step(state=True)["state_dir"]
    shown = attacker.run("tr '\\0' ' ' < /proc/1/cmdline")
    assert shown["exit_code"] == 0 and shown["output"].startswith("bwrap --args "), shown
    assert state not in shown["output"] and os.path.dirname(attacker.runner) not in shown["output"]


def test_the_hosts_environment_stays_out(attacker_factory, home: Path):
    attacker = attacker_factory(AWS_SECRET_ACCESS_KEY="hunter2", JUPYTERHUB_API_TOKEN="hub-token",
                                WANTED="on-purpose", OWSANDBOX_ENV="WANTED")
    attacker.start(home / "project")
    env = attacker.run("env")["output"]
    assert "hunter2" not in env and "hub-token" not in env and "JUPYTERHUB" not in env
    assert "WANTED=on-purpose" in env and f"HOME={home}" in env
    # Every process the box can see, its pid 1 (bubblewrap's own init) first: none holds the host's.
    everyone = attacker.run("for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ; tr '\\0' ' ' < $p/cmdline; "
                            "done 2>/dev/null; tr '\\0' '\\n' < /proc/1/environ | wc -l")["output"]
    assert "hunter2" not in everyone and "hub-token" not in everyone and "JUPYTERHUB" not in everyone
    assert "WANTED=on-purpose" in everyone and int(everyone.split()[-1]) > 0  # pid 1's was read
    assert "WANTED" in attacker.step(describe=True)["environment"]


def test_host_unix_sockets_are_not_reachable(attacker: Attacker, who: str):
    folders = ["/var/tmp", "/tmp"] + (["/run"] if who == "root" else [])
    listeners = []
    try:
        for folder in folders:
            path = os.path.join(folder, f"owsbx-host-{os.getpid()}.sock")
            listener = socket.socket(socket.AF_UNIX)
            listener.bind(path)
            listener.listen(1)
            os.chmod(path, 0o777)
            listeners.append((listener, path))
        for _, path in listeners:
            done = attacker.run(f"python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); s.connect('{path}'); "
                                f"print('connected')\"")
            assert "connected" not in done["output"], path
        for sock in ("/run/docker.sock", "/var/run/docker.sock", "/run/dbus/system_bus_socket"):
            assert attacker.run(f"test -e {sock}")["exit_code"] != 0, sock
        abstract = attacker.run("python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); "
                                "s.connect('\\0/tmp/.X11-unix/X0')\"")
        assert abstract["exit_code"] != 0
        tcp = attacker.run("python3 -c \"import socket; socket.create_connection(('127.0.0.1', 22), 2)\"")
        assert tcp["exit_code"] != 0
    finally:
        for listener, path in listeners:
            listener.close()
            os.unlink(path)


def test_what_held_still_holds(attacker: Attacker, home: Path):
    for attempt in ("ls /proc/1/root/root", "cat /proc/1/environ | tr '\\0' '\\n' | grep -c SECRET",
                    "ls /home /root /srv /mnt /media", "touch /var/owned", "touch /owned",
                    "echo 1 > /proc/sys/vm/drop_caches", "echo h > /proc/sysrq-trigger",
                    "echo x > /proc/sys/kernel/hostname", "head -c1 /proc/kcore | wc -c | grep -x 1"):
        done = attacker.run(attempt)
        assert done["exit_code"] != 0, (attempt, done)
    tiocsti = attacker.run("python3 -c \"import fcntl, termios; fcntl.ioctl(0, termios.TIOCSTI, b'x')\"")
    assert tiocsti["exit_code"] != 0
    # Other local users cannot reach the sandbox's sockets: its host folder is private, the sockets 0600.
    state = Path(attacker.step(state=True)["state_dir"])
    assert state.stat().st_mode & 0o777 == 0o700
    for name in ("runner.sock", "execd.sock"):
        assert (state / "run" / name).stat().st_mode & 0o777 == 0o600, name


def test_a_sandbox_whose_kernel_is_killed_ends_within_the_linger_time(attacker_factory, home: Path):
    attacker = attacker_factory()
    attacker.start(home / "project", key=own_key("kernel-killed"), linger_seconds=2)
    attacker.run("setsid sleep 300 & (setsid sleep 301 &) ; nohup sleep 302 >/dev/null 2>&1 & echo ok")
    pidns = attacker.step(state=True)["pidns"]
    assert len(_in_namespace(pidns)) >= 4
    attacker.kill()
    wait_until(lambda: not _in_namespace(pidns), 20, "the sandbox to end with its kernel", interval=0.1)


def test_a_private_folder_made_first_by_someone_else_is_not_used(attacker_factory, home: Path, owner, who: str):
    """Another local user makes the first place tried, TMPDIR/owsandbox-UID, first (mode 777): the sandbox
    still starts, elsewhere. (A TMPDIR of the test's own: the machine's /tmp/owsandbox-UID holds other
    kernels' state, which a test run beside this one is using.)"""
    tmpdir = Path(tempfile.mkdtemp(prefix="ows-sq-"))  # short: the sockets go below the folder chosen
    os.chmod(tmpdir, 0o755)
    squat = tmpdir / f"owsandbox-{owner.pw_uid}"
    try:
        squat.mkdir(mode=0o777)
        os.chmod(squat, 0o777)
        if who == "root":
            from .conftest import plain_user
            other = plain_user()
            os.chown(squat, other.pw_uid, other.pw_gid)
        else:
            os.chown(squat, 0, 0)
        attacker = attacker_factory(TMPDIR=str(tmpdir))
        attacker.start(home / "project", key=own_key("kernel-squatted"), linger_seconds=5)
        state = attacker.step(state=True)["state_dir"]
        assert not state.startswith(str(squat)), state
        assert attacker.run("echo fine")["output"] == "fine\n"
        assert list(squat.iterdir()) == []
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


@pytest.mark.parametrize("signal_name", ["SIGKILL"])
def test_killing_the_daemon_from_inside_brings_a_fresh_sandbox(attacker: Attacker, signal_name: str):
    first = attacker.step(state=True)
    attacker.run(f"kill -{getattr(signal, signal_name).value} 2")
    assert attacker.run("echo again")["output"].endswith("again\n")
    assert attacker.step(state=True)["init_pid"] != first["init_pid"]


def test_with_network_on_the_hosts_loopback_services_stay_out_of_reach(attacker_factory, home: Path):
    """Network on means out, not in: the box gets a route out (pasta), not the host's loopback services.
    pasta joins the sandbox's network once it exists, as root and as a plain user."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    try:
        attacker = attacker_factory()
        attacker.start(home / "project", network=True)
        assert attacker.step(describe=True)["network"] == "outbound"
        # The host's record of the box's init is the init itself (pid 1 of the box's namespace): when a plain
        # user's bubblewrap ran inside pasta it reported the pid pasta's namespace gave it (once taken for the
        # host's: pid 2, kthreadd, was what shutdown signalled).
        init = attacker.step(state=True)["init_pid"]
        assert namespace_pids(init)[-1] == 1 and command_line(init).startswith("bwrap"), (init, command_line(init))
        routes = attacker.run("cat /proc/net/route")["output"].splitlines()[1:]
        assert any(line.split()[1] == "00000000" for line in routes), routes  # a default route out
        port = server.getsockname()[1]
        for host in ("127.0.0.1", "localhost"):
            tried = attacker.run(f"python3 -c \"import socket; socket.create_connection(('{host}', {port}), 3); "
                                 f"print('REACHED')\"")
            assert "REACHED" not in tried["output"], (host, tried)
    finally:
        server.close()
