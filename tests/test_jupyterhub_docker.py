"""Two students on one JupyterHub with DockerSpawner: each student's server a container, each cell in a
bubblewrap box nested in it.

A teacher's setup with containers, for real (tests/hub.py: DockerHub): `jupyterhub` as root with
`configurable-http-proxy`, a password per student, and DockerSpawner starting each student's server
as a container of the single-user image (share/containers/singleuser.Containerfile, built by the
test session) on the tests' own dockerd (tests/containers.py), with the allowances bubblewrap needs
to nest there and nothing more (the hub's config says which and why). What stands in: the tests'
dockerd has no bridge, so the containers are in the host's network, each server on a loopback port
of its own (the host's firewall is left alone); a hub on a host with a Docker network uses
DockerSpawner unchanged. Students log in through the hub's URL and drive their kernels through it
(REST and the kernel WebSocket).

Runs as root (the tests' dockerd). Needs Docker, podman and debootstrap (the images), bubblewrap,
configurable-http-proxy, jupyterhub and dockerspawner; skipped on a developer's machine without them,
a failure in CI.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from .conftest import require_bwrap
from .hub import BOX_LIMITS, FIRST_UID, DockerHub, HubKernel, Student, class_of
from .processes import pid_alive
from .test_jupyterhub import FORK_BOMB
from .waiting import patience, wait_until

# The module's classroom (a hub, two students' containers) starts inside the first test's timeout: 80 s on
# a quiet pair of slow cores, over 120 s beside other work. Here the timeout is a hang guard only.
pytestmark = [pytest.mark.system, pytest.mark.needs_singleuser_image, pytest.mark.timeout(900)]


def _require_docker_hub() -> None:
    problems = []
    if shutil.which("configurable-http-proxy") is None:
        problems.append("configurable-http-proxy is not installed (npm install --global configurable-http-proxy)")
    try:
        import dockerspawner  # noqa: F401
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
    hub: DockerHub
    a: Student
    b: Student
    kernels: dict[str, HubKernel]
    tokens: dict[str, str]

    def kernel(self, student: Student) -> HubKernel:
        return self.kernels[student.name]


@pytest.fixture(scope="module")
def classroom(docker) -> Iterator[Classroom]:
    _require_docker_hub()
    a, b = class_of(2, prefix="owsbx-dk-")
    hub = DockerHub([a, b], docker, docker.singleuser_image())
    kernels: dict[str, HubKernel] = {}
    try:
        hub.start()
        with ThreadPoolExecutor(2) as pool:  # two students logging in at once, as a class does
            done = dict(zip((a.name, b.name), pool.map(hub.log_in_and_run_a_cell, (a, b)), strict=True))
        kernels = {name: kernel for name, (_, kernel, _) in done.items()}
        seconds = {name: round(took, 2) for name, (_, _, took) in done.items()}
        print(f"login to first result through the hub, each server a container: {seconds}")
        yield Classroom(hub, a, b, kernels, {name: token for name, (token, _, _) in done.items()})
    finally:
        for kernel in kernels.values():
            try:
                kernel.close(shutdown=False)  # stopping the hub stops the servers, which shut their kernels down
            except Exception as exc:  # noqa: BLE001 - a closed server or socket must not stop the teardown
                print(f"kernel {kernel.id}: {exc}")
        left = hub.stop()
        print(f"jupyterhub log (tail):\n{hub.final_log}")
    assert not left, f"left after the hub stopped (now ended): {left}"


def top(classroom: Classroom, student: Student) -> dict[int, str]:
    """The processes of the student's container, as the host sees them: host pid → command line."""
    listed = classroom.hub.docker.run("top", classroom.hub.container(student.name), "-eo", "pid,args").stdout
    rows = [line.strip().split(None, 1) for line in listed.splitlines()[1:] if line.strip()]
    return {int(row[0]): row[1] if len(row) > 1 else "" for row in rows}


def test_each_students_server_is_a_container_and_each_cell_runs_in_bubblewrap_inside_it(classroom: Classroom):
    """Seen from inside (the sandbox's variable, the user, the box's own host name) and from the host (the
    server, its kernel and bubblewrap among the container's processes; one container per student)."""
    hub = classroom.hub
    assert sorted(hub.containers()) == sorted(hub.container(s.name) for s in (classroom.a, classroom.b))
    uids = set()
    for student in (classroom.a, classroom.b):
        cell = classroom.kernel(student).run('echo "$OWSANDBOX_SANDBOX"; hostname; pwd; ulimit -u; id -u')
        assert cell.status == "ok", cell.outputs
        *words, uid = cell.text().split()
        assert words == ["bwrap", "sandbox", "/home/student/work", "256"], cell.outputs
        uids.add(int(uid))
        processes = list(top(classroom, student).values())
        # the server, and bubblewrap with the box's runner in it (the kernel's command is cut short by `top`)
        assert any("jupyterhub.singleuser" in args for args in processes), processes
        assert any(args.startswith("bwrap ") and "runner.pyz serve" in args for args in processes), processes
        image = hub.docker.run("inspect", "--format", "{{.Config.Image}}", hub.container(student.name)).stdout.strip()
        assert image == hub.image
    # a uid of each student's own, so that neither one's processes count against the other's limit
    assert len(uids) == 2 and min(uids) > FIRST_UID, uids


def test_the_server_offers_the_sandbox_only_and_the_box_holds_no_hub_token(classroom: Classroom):
    """The image's server config: no terminal, no other kernel (either would run in the container outside
    the box). The container's server holds its hub token (JUPYTERHUB_API_TOKEN); the box does not."""
    hub, name, token = classroom.hub, classroom.a.name, classroom.tokens[classroom.a.name]
    status, specs = hub.request("GET", f"/user/{name}/api/kernelspecs", token=token)
    assert status == 200 and set(specs["kernelspecs"]) == {"owsandbox"}, specs
    status, answer = hub.request("POST", f"/user/{name}/api/kernels", {"name": "python3"}, token=token)
    assert status in (403, 500) and "only the sandbox kernel" in str(answer), (status, answer)
    assert hub.request("POST", f"/user/{name}/api/terminals", {}, token=token)[0] == 404
    server_env = hub.docker.run("exec", hub.container(name), "sh", "-c", "tr '\\0' '\\n' < /proc/1/environ").stdout
    assert "JUPYTERHUB_API_TOKEN=" in server_env
    shown = classroom.kernel(classroom.a).run("env; tr '\\0' '\\n' < /proc/1/environ").text()
    assert "OWSANDBOX_SANDBOX=bwrap" in shown and "JUPYTERHUB_" not in shown and "JPY_" not in shown, shown


def test_a_fork_bomb_in_one_students_box_leaves_the_other_students_cells_running(classroom: Classroom):
    """A holds its box at its process limit while B runs a cell that forks; A's cell then ends with the
    named error and A's next cell runs. (With one uid for all, A would take B's processes too.)"""
    hub, a, b = classroom.hub, classroom.kernel(classroom.a), classroom.kernel(classroom.b)
    release = f"release-{secrets.token_hex(4)}"
    bomb = a.send(FORK_BOMB.replace("RELEASE", release))
    try:
        a.wait_for_stdout(bomb, "refused after", timeout=60)  # A's box is at its process limit now
        other = b.run('for i in $(seq 40); do (exit 0) & done; wait; echo "B still runs"', timeout=30)
        assert other.status == "ok" and other.text() == "B still runs\n", other.outputs
    finally:
        hub.docker.run("exec", hub.container(classroom.a.name), "touch", f"/home/student/work/{release}", check=False)
    done = a.collect(bomb, timeout=60)
    made = int(done.text().split("refused after ")[1].split()[0])
    print(f"A's box: a new process refused after {made} (its limit {BOX_LIMITS}, counting A's uid's processes)")
    assert made < 256, done.text()
    assert done.status == "error" and done.error["ename"] == "TooManyProcesses", done.outputs
    assert a.run(f"rm {release}; echo recovered").text() == "recovered\n"


def test_a_cannot_see_or_signal_bs_files_or_processes(classroom: Classroom):
    """B leaves a file in its home and /tmp and a program running; A's box, and A's container outside the
    box, look for them by B's paths and pids: different containers, nothing of B's is there."""
    a, b = classroom.kernel(classroom.a), classroom.kernel(classroom.b)
    secret, seconds = secrets.token_hex(8), 700000 + secrets.randbelow(99999)
    started = b.run(f"echo {secret} > notes-b.txt; echo {secret} > /tmp/marker-b; sleep {seconds} & echo $!")
    assert started.status == "ok", started.outputs
    # The sleep execs after the cell has ended: wait until B's container shows it.
    def with_the_sleep() -> dict[int, str] | None:
        listed = top(classroom, classroom.b)
        return listed if any(args.startswith(f"sleep {seconds}") for args in listed.values()) else None

    b_top = wait_until(with_the_sleep, patience(10), "B's sleep to start", interval=0.2)
    hub = classroom.hub
    # where B's file is: that path in B's container, and B's server serves it to B
    assert hub.docker.run("exec", hub.container(classroom.b.name), "cat", "/home/student/work/notes-b.txt").stdout \
        == f"{secret}\n"
    assert hub.request("GET", f"/user/{classroom.b.name}/api/contents/notes-b.txt?content=1",
                       token=classroom.tokens[classroom.b.name])[1]["content"] == f"{secret}\n"
    sleeper = next(pid for pid, args in b_top.items() if args.startswith(f"sleep {seconds}"))
    # in A's box: the same paths, B's host pids, and every process's command line
    for attempt in ("cat /home/student/work/notes-b.txt", "cat /tmp/marker-b"):
        done = a.run(attempt)
        assert done.status == "error" and secret not in done.text(), (attempt, done.outputs)
    seen = a.run("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '").text()
    assert str(seconds) not in seen, seen
    killed = a.run(" ".join(f"kill -9 {pid} 2>/dev/null && echo killed {pid};" for pid in b_top) + " true")
    assert "killed" not in killed.text(), killed.outputs
    # in A's container, outside the box (what A's server and kernel see)
    looked = hub.docker.run("exec", hub.container(classroom.a.name), "sh", "-c",
                            "cat /home/student/work/notes-b.txt; cat /proc/[0-9]*/cmdline | tr '\\0' ' '", check=False)
    assert secret not in looked.stdout and str(seconds) not in looked.stdout, looked.stdout
    lasting = [pid for pid, args in b_top.items()
               if pid == sleeper or "jupyterhub.singleuser" in args or args.startswith("bwrap ")]
    assert len(lasting) >= 3 and all(pid_alive(pid) for pid in lasting), b_top
    # A's token opens A's server only
    assert hub.request("GET", f"/user/{classroom.b.name}/api/contents/notes-b.txt?content=1",
                       token=classroom.tokens[classroom.a.name])[0] == 403
    after = b.run("cat notes-b.txt /tmp/marker-b; kill %1 && echo ok").text()
    assert after.startswith(f"{secret}\n{secret}\nok\n"), after


def test_stopping_a_students_server_removes_its_container(classroom: Classroom):
    """Last in this module: B's server, its container and every process in it are gone; A's runs on."""
    hub, b = classroom.hub, classroom.b
    assert classroom.kernel(b).run("sleep 600 & setsid sleep 601 & echo started").status == "ok"
    pids = list(top(classroom, b))
    assert len(pids) >= 5, pids
    hub.stop_server(b.name)
    wait_until(lambda: hub.container(b.name) not in hub.containers(), 30, "B's container to be removed")
    wait_until(lambda: not [pid for pid in pids if pid_alive(pid)], 30, "the processes of B's container to end")
    assert hub.containers() == [hub.container(classroom.a.name)]
    assert classroom.kernel(classroom.a).run("echo A unaffected").text() == "A unaffected\n"
