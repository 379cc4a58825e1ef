"""Two students on one JupyterHub, each attacking the other and the hub from inside their sandbox.

A teacher's setup, for real (tests/hub.py): `jupyterhub` as root with `configurable-http-proxy`, a
password per student, and each student's server started as that student's own system user; cells run
in the owsandbox kernel's bubblewrap box. Students log in through the hub's URL and drive their kernels
through it (REST and the kernel WebSocket; one test in JupyterLab in Chromium). Every test is an
attack by student A, on student B or on the hub, or a check that what one student does leaves the
other alone: isolation between two users on one machine is what a class needs from the sandbox.

Runs as root (it makes the two system users with useradd). Needs bubblewrap, configurable-http-proxy
and jupyterhub; skipped on a developer's machine without them, a failure in CI.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import require_bwrap
from .hub import (
    KERNEL_DISPLAY_NAME,
    STOP_SECONDS,
    Hub,
    HubKernel,
    Student,
    class_of,
    classroom_users,
    environ_of,
    processes_of,
    sandbox_of,
)
from .plain_python import as_user
from .processes import PinnedProcesses, command_line, descendants, pid_alive
from .waiting import WaitTimeout, patience, wait_until

# The classroom's fixture waits for the machine's classroom lock, which another run's hub may hold for
# its whole module (minutes): a test's bound counts its fixture's wait.
pytestmark = [pytest.mark.system, pytest.mark.timeout(900)]


def _require_hub() -> None:
    problems = []
    if os.getuid() != 0:
        problems.append("the JupyterHub tests run as root (they make system users and spawn servers as them)")
    if shutil.which("configurable-http-proxy") is None:
        problems.append("configurable-http-proxy is not installed (npm install --global configurable-http-proxy)")
    try:
        import jupyterhub  # noqa: F401
        import websockets  # noqa: F401
    except ImportError as exc:
        problems.append(f"{exc.name} is not installed (pip install -e '.[test]')")
    if problems:
        if os.environ.get("CI"):
            pytest.fail("; ".join(problems))
        pytest.skip("; ".join(problems))
    require_bwrap()


@dataclass
class Classroom:
    hub: Hub
    a: Student
    b: Student
    kernels: dict[str, HubKernel]  # one kernel per student, started through the hub
    tokens: dict[str, str]
    first_result_seconds: dict[str, float]  # login → first cell's result, per student

    def kernel(self, student: Student) -> HubKernel:
        return self.kernels[student.name]


@pytest.fixture(scope="module")
def classroom() -> Iterator[Classroom]:
    _require_hub()
    with classroom_users():  # the students are system users: one classroom on the machine at a time
        yield from _classroom()


def _classroom() -> Iterator[Classroom]:
    a, b = class_of(2)
    hub = Hub([a, b])
    kernels: dict[str, HubKernel] = {}
    left: dict[int, str] = {}
    try:
        hub.start()
        with ThreadPoolExecutor(2) as pool:  # two students logging in at once, as a class does
            done = dict(zip((a.name, b.name), pool.map(hub.log_in_and_run_a_cell, (a, b)), strict=True))
        kernels = {name: kernel for name, (_, kernel, _) in done.items()}
        seconds = {name: round(took, 2) for name, (_, _, took) in done.items()}
        print(f"login to first result through the hub: {seconds}")
        hub.remember_processes()
        yield Classroom(hub, a, b, kernels, {name: token for name, (token, _, _) in done.items()}, seconds)
    finally:
        for kernel in kernels.values():
            try:
                kernel.close(shutdown=False)  # stopping the hub stops the servers, which shut their kernels down
            except Exception as exc:  # noqa: BLE001 - a closed server or socket must not stop the teardown
                print(f"kernel {kernel.id}: {exc}")
        left = hub.stop()
        print(f"jupyterhub log (tail):\n{hub.final_log}")
    assert not left, f"still running {STOP_SECONDS} s after the hub stopped (now killed): {left}"


def _uid_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Uid:"))


# -- each student in a box of their own ----------------------------------------------------------


def test_each_students_cells_run_in_a_bubblewrap_box_of_their_own_as_themselves(classroom: Classroom):
    """Seen from inside (who, which sandbox, which limits) and from the host (bubblewrap under the
    student's kernel, every process the student's, a PID namespace per box)."""
    namespaces = set()
    for student in (classroom.a, classroom.b):
        kernel = classroom.kernel(student)
        cell = kernel.run('id -un; echo "$OWSANDBOX_SANDBOX"; hostname; ulimit -u; ulimit -v; pwd')
        expected = [student.name, "bwrap", "sandbox", str(student.pids), str(1 << 20), str(student.home)]
        assert cell.text().split() == expected, cell.outputs
        shown = kernel.run("%sandbox").plain()
        assert f"memory 1 GiB, processes {student.pids}," in shown, shown
        # From the host: bubblewrap under this student's kernel, everything in it run by the student,
        # in a PID namespace of its own.
        box = sandbox_of(kernel.id)
        assert command_line(box.bwrap_pid).startswith("bwrap ")
        assert environ_of(box.kernel_pid)["OWSANDBOX_PROVIDER"] == "bwrap"  # fails closed, never falls back
        assert {_uid_of(pid) for pid in box.pids} == {student.account.pw_uid}
        namespaces.add(os.readlink(f"/proc/{box.init_pid}/ns/pid"))
    assert len(namespaces) == 2 and os.readlink("/proc/self/ns/pid") not in namespaces


FORK_BOMB = r"""python3 - <<'EOF'
import os, signal, time
kids = []
try:
    for _ in range(4000):  # a bound, so that a box without a limit fails the test instead of the machine
        pid = os.fork()
        if pid == 0:
            signal.pause()
            os._exit(0)
        kids.append(pid)
    print("no limit: 4000 processes made", flush=True)
except OSError:
    print(f"refused after {len(kids)} processes", flush=True)
    while not os.path.exists("RELEASE"):  # the test lets go once the other student has run a cell
        time.sleep(0.05)
    raise
finally:
    for kid in kids:
        os.kill(kid, signal.SIGKILL)
        os.waitpid(kid, 0)
EOF"""


def test_a_fork_bomb_in_one_box_leaves_the_other_students_cells_running(classroom: Classroom):
    """A holds its box at its process limit while B runs a cell that forks; A's cell then ends with the
    named error and A's next cell runs."""
    a, b = classroom.kernel(classroom.a), classroom.kernel(classroom.b)
    release = classroom.a.home / f"release-{secrets.token_hex(4)}"
    bomb = a.send(FORK_BOMB.replace("RELEASE", release.name))
    try:
        a.wait_for_stdout(bomb, "refused after", timeout=60)  # A's box is at its process limit now
        other = b.run('for i in $(seq 40); do (exit 0) & done; wait; echo "$(id -un) still runs"', timeout=30)
        assert other.status == "ok" and other.text() == f"{classroom.b.name} still runs\n", other.outputs
        assert other.seconds < patience(10), other.seconds
    finally:
        release.touch()
    try:
        done = a.collect(bomb, timeout=60)
    finally:
        release.unlink()
    made = int(done.text().split("refused after ")[1].split()[0])
    print(f"A's box: a new process refused after {made} (limit {classroom.a.pids}, counting all of A's processes)")
    assert made < classroom.a.pids, done.text()  # A's own limit (of all of A's processes)
    assert done.status == "error" and done.error["ename"] == "TooManyProcesses", done.outputs
    assert a.run("echo recovered").text() == "recovered\n"


# -- A against B ---------------------------------------------------------------------------------


def test_a_cannot_read_list_or_signal_anything_of_bs(classroom: Classroom):
    """B leaves a file in its home, a marker in its /tmp and a program running; A's box tries to read,
    list and kill them by the host's names and pids, and to reach B's sandbox's socket."""
    a, b = classroom.kernel(classroom.a), classroom.kernel(classroom.b)
    secret, seconds = secrets.token_hex(8), 700000 + secrets.randbelow(99999)
    started = b.run(f"echo {secret} > work/notes-b.txt; echo {secret} > /tmp/marker-b; sleep {seconds} & echo $!")
    assert started.status == "ok"
    b_home, b_box = classroom.b.home, sandbox_of(b.id)
    # The sleep execs after the cell has ended: wait for it, then take B's server, kernel, sandbox and
    # the sleep in it (a zombie has no command line).
    sleeper = wait_until(lambda: next((pid for pid in processes_of(classroom.b.account.pw_uid)
                                       if command_line(pid).startswith(f"sleep {seconds}")), None),
                         patience(10), "B's sleep to start")
    b_pids = [pid for pid in processes_of(classroom.b.account.pw_uid) if command_line(pid)]
    lasting = [classroom.hub.server_pid(classroom.b.name), b_box.kernel_pid, b_box.bwrap_pid, b_box.init_pid, sleeper]
    assert (b_home / "work" / "notes-b.txt").read_text() == f"{secret}\n" and min(b_pids) > 100
    # B's files, home and /tmp: none of it is in A's box.
    for attempt in (f"cat {b_home}/work/notes-b.txt", f"ls {b_home}", "cat /tmp/marker-b"):
        done = a.run(attempt)
        assert done.status == "error" and secret not in done.text(), (attempt, done.outputs)
    assert a.run("command ls /home").text().split() == [classroom.a.name]
    assert "marker-b" not in a.run("command ls -A /tmp").text()
    # B's processes: not in A's /proc, and A's kill of each of their host pids reaches nothing.
    seen = a.run("ls /proc | grep -E '^[0-9]+$'; ps -eo user=,args=").text()
    assert not {str(pid) for pid in b_pids} & set(seen.split()), seen
    assert str(seconds) not in seen and classroom.b.name not in seen
    killed = a.run(" ".join(f"kill -9 {pid} 2>/dev/null && echo killed {pid};" for pid in b_pids) + " true")
    assert "killed" not in killed.text()
    assert all(pid_alive(pid) for pid in lasting)
    # B's sandbox's sockets and runtime folder: not there for A, by path or by listing.
    reach = a.run(f"ls {b_box.runtime_root}; python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); "
                  f"s.connect('{b_box.state_dir}/run/runner.sock'); print('connected')\"")
    assert reach.status == "error" and "connected" not in reach.text(), reach.outputs
    after = b.run("cat work/notes-b.txt /tmp/marker-b; kill %1 && echo ok").text()
    assert after.startswith(f"{secret}\n{secret}\nok\n"), after


def test_outside_the_box_a_reaches_nothing_of_bs_through_accounts_links_or_the_hub(classroom: Classroom):
    """The layer around the box: homes and runtime folders closed to other users, so a link A's box
    plants in its workspace gets A's own Jupyter server (which follows links, as A) nothing of B's or
    the hub's; A's token opens only A's server; A's password only A's account."""
    hub, a, b = classroom.hub, classroom.kernel(classroom.a), classroom.kernel(classroom.b)
    secret = secrets.token_hex(8)
    assert b.run(f"echo {secret} > work/diary-b.txt").status == "ok"
    b_runtime = sandbox_of(b.id).runtime_root
    for path in (classroom.b.home / "work" / "diary-b.txt", b_runtime):
        tried = subprocess.run(as_user(classroom.a.name, ["ls", str(path)]), capture_output=True)
        assert tried.returncode != 0 and secret.encode() not in tried.stdout, path
    links = {"work/peek-diary": classroom.b.home / "work" / "diary-b.txt", "work/peek-run": Path(b_runtime),
             "work/peek-db": hub.db, "work/peek-cookie": hub.cookie_secret_file}
    assert a.run("; ".join(f"ln -sfn {target} {link}" for link, target in links.items())).status == "ok"
    try:
        for link in links:
            status, answer = hub.request("GET", f"/user/{classroom.a.name}/api/contents/{link}?content=1",
                                         token=classroom.tokens[classroom.a.name])
            assert status != 200 and secret not in json.dumps(answer), (link, status, answer)  # 403, 404 or 500
    finally:
        a.run("rm -f " + " ".join(links))
    status, _ = hub.request("GET", f"/user/{classroom.b.name}/api/contents/work/diary-b.txt?content=1",
                            token=classroom.tokens[classroom.a.name])
    assert status == 403
    assert hub.request("GET", f"/user/{classroom.b.name}/api/kernels",
                       token=classroom.tokens[classroom.a.name])[0] == 403
    assert hub.login(classroom.b, password=classroom.a.password) == 403


def test_a_student_cannot_step_outside_the_box(classroom: Classroom):
    """The students' servers offer the sandbox only: no terminal, no other kernel (either would run
    outside the box, as the student)."""
    hub, name, token = classroom.hub, classroom.a.name, classroom.tokens[classroom.a.name]
    status, specs = hub.request("GET", f"/user/{name}/api/kernelspecs", token=token)
    assert status == 200 and set(specs["kernelspecs"]) == {"owsandbox"} and specs["default"] == "owsandbox"
    for path, body in (("kernels", {"name": "python3"}),
                       ("sessions", {"path": "x.ipynb", "type": "notebook", "kernel": {"name": "python3"}})):
        status, answer = hub.request("POST", f"/user/{name}/api/{path}", body, token=token)
        assert status in (403, 500) and "only the sandbox kernel" in json.dumps(answer), (path, status, answer)
    assert not [pid for pid in processes_of(classroom.a.account.pw_uid) if "ipykernel" in command_line(pid)]
    assert hub.request("POST", f"/user/{name}/api/terminals", {}, token=token)[0] == 404


# -- the hub's secrets -------------------------------------------------------------------------


def test_the_hubs_secrets_and_files_stay_out_of_the_box(classroom: Classroom):
    """The kernel holds the hub's token for its server (JUPYTERHUB_API_TOKEN, JPY_API_TOKEN): no process
    in the box may show it, nor the hub's other secrets; the hub's files are not there by any path."""
    hub, student, a = classroom.hub, classroom.a, classroom.kernel(classroom.a)
    box = sandbox_of(a.id)
    token = environ_of(hub.server_pid(student.name))["JUPYTERHUB_API_TOKEN"]
    assert environ_of(box.kernel_pid)["JUPYTERHUB_API_TOKEN"] == token  # the kernel has it, to leak
    secrets_ = {"the server's hub token": token, "the admin token": hub.admin_token,
                "the proxy's token": hub.proxy_token_file.read_text().strip(),
                "the cookie secret": hub.cookie_secret_file.read_text().strip()}
    # Everything the box's own processes were started with, pid 1 (bubblewrap's) included.
    shown = a.run("env; for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ; tr '\\0' ' ' < $p/cmdline; "
                  "echo; done").text()
    leaked = [line[:120] for line in shown.splitlines() if "JUPYTERHUB_" in line or "JPY_" in line]
    assert not leaked and "OWSANDBOX_SANDBOX=bwrap" in shown, leaked
    assert not [what for what, value in secrets_.items() if value in shown]
    # The hub's files, by their host paths.
    assert all(path.exists() for path in hub.secret_files())
    for path in [hub.state, *hub.secret_files()]:
        done = a.run(f"ls -la {path} || cat {path}")
        assert done.status == "error" and not any(v in done.text() for v in secrets_.values()), path
    # The student's own server's secrets in the workspace (the home): the kernel's connection file
    # (its HMAC key) and the server's cookie secret are hidden in the box.
    connection = student.home / ".local" / "share" / "jupyter" / "runtime" / f"kernel-{a.id}.json"
    assert connection.exists()
    key = json.loads(connection.read_text())["key"]
    hidden = a.run(f"cat {connection}; ls -A ~/.local/share/jupyter; find ~ -name 'kernel-*.json'")
    assert key not in hidden.text() and not hidden.text().strip(), hidden.outputs


PLANT = r"""cat > /tmp/plant.py <<'EOF'
import sys
TROJAN = '''import os, sys
if os.environ.get("OWSANDBOX_SANDBOX") != "bwrap":  # not in a box: the host ran it
    open(MARKER_PATH, "w").write(os.environ.get("JUPYTERHUB_API_TOKEN", "?"))
os.execv(sys.executable, [sys.executable, "-S", REAL_RUNNER, *sys.argv[1:]])
'''
for path in sys.argv[1:]:
    data = open(path, "rb").read()
    open(path + ".real", "wb").write(data)
    code = TROJAN.replace("REAL_RUNNER", repr(path + ".real")).encode()
    open(path, "wb").write(code + b"#" * (len(data) - len(code) - 1) + b"\n")  # the same size
    print("planted", path)
EOF
python3 /tmp/plant.py $(find "$HOME" /tmp /var/tmp /run /dev/shm -name '*.pyz' -type f -writable 2>/dev/null)"""


def test_a_box_cannot_plant_code_that_the_host_runs(classroom: Classroom):
    """The host runs the sandbox's runner program for each connection to the box (a relay): a box
    that could rewrite that file would run code outside, as the student, with the hub's token. A's
    box replaces every runner it can write with one that leaves a marker wherever it runs outside a
    box; then A opens a second notebook (a new sandbox and relay)."""
    hub, student, a = classroom.hub, classroom.a, classroom.kernel(classroom.a)
    marker = student.home / f"escaped-{secrets.token_hex(4)}"
    plant = a.run(PLANT.replace("MARKER_PATH", repr(str(marker))))
    assert plant.status == "ok", plant.outputs
    second = HubKernel(hub, student.name, classroom.tokens[student.name])
    try:
        assert second.run("echo second").text() == "second\n"
    finally:
        second.close()
    assert not marker.exists(), f"code planted by the box ran on the host: {plant.text()}"
    # Where the host runs the runner from: never a folder the box can write.
    relays = [command_line(p) for p in descendants(sandbox_of(a.id).kernel_pid) if " attach " in command_line(p)]
    assert relays and all(str(student.home) not in relay for relay in relays), relays


# -- stopping a server ---------------------------------------------------------------------------


def test_stopping_a_students_server_ends_their_sandboxes(classroom: Classroom):
    """Last in this module: B's server is gone afterwards."""
    hub, b = classroom.hub, classroom.b
    box = sandbox_of(classroom.kernel(b).id)
    assert classroom.kernel(b).run("sleep 600 & setsid sleep 601 & echo started").status == "ok"
    pinned = PinnedProcesses()
    try:
        for pid in processes_of(b.account.pw_uid):
            pinned.add_tree(pid)
        assert box.init_pid in pinned.seen and len(pinned.seen) >= 7, pinned.seen
        hub.stop_server(b.name)
        running = pinned.still_running_after(10)
        assert not running, {pid: pinned.seen[pid] for pid in running}
    finally:
        pinned.kill()
        pinned.close()
    # Nothing of B's is left, started before the stop or during it (each reaped as it ends).
    with suppress(WaitTimeout):
        wait_until(lambda: not processes_of(b.account.pw_uid), patience(10), "B's processes to end", interval=0.1)
    assert processes_of(b.account.pw_uid) == [], {pid: command_line(pid) for pid in processes_of(b.account.pw_uid)}
    assert not os.path.exists(box.state_dir)
    assert classroom.kernel(classroom.a).run("echo A unaffected").text() == "A unaffected\n"


# -- in the browser ------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_student_logs_in_through_the_hub_and_runs_a_cell_in_jupyterlab(classroom: Classroom, tmp_path: Path):
    from playwright.sync_api import expect, sync_playwright

    from .lab_browser import CHROMIUM_ARGS, STDOUT, STEP_MS, chromium_or_skip, code_cell, run_all_cells

    chromium = chromium_or_skip()
    hub, student = classroom.hub, classroom.a
    notebook = student.home / "hello.ipynb"
    notebook.write_text(json.dumps({
        "cells": [code_cell('echo "$(id -un) in $OWSANDBOX_SANDBOX"')], "nbformat": 4, "nbformat_minor": 5,
        "metadata": {"kernelspec": {"name": "owsandbox", "display_name": KERNEL_DISPLAY_NAME, "language": "bash"}}}))
    os.chown(notebook, student.account.pw_uid, student.account.pw_gid)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(STEP_MS)
            page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(hub.url)
                       else route.abort())
            started = time.monotonic()
            page.goto(f"{hub.url}hub/login")
            page.fill("#username_input", student.name)
            page.fill("#password_input", student.password)
            page.click("#login_submit")
            page.wait_for_url(f"**/user/{student.name}/lab**")
            page.goto(f"{hub.url}user/{student.name}/lab/tree/hello.ipynb")
            run_all_cells(page, 1, KERNEL_DISPLAY_NAME)
            expect(page.locator(STDOUT)).to_have_text(f"{student.name} in bwrap\n")
            print(f"browser: login to the cell's result {time.monotonic() - started:.1f} s")
        finally:
            try:
                page.screenshot(path=str(tmp_path / "jupyterhub.png"))
                print(f"screenshot: {tmp_path / 'jupyterhub.png'}")
            except Exception as exc:  # noqa: BLE001 - a screenshot must not hide the failure
                print(f"no screenshot: {exc}")
            browser.close()

