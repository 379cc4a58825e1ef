"""The container provider with real engines: a fresh container per kernel from an image, removed at the end.

The image is the Debian 12 one of tests/containers.py (its marker file is not on the host), run as
root by podman (with the tests' containers.conf) and by Docker (a dockerd of the session's own,
reached through DOCKER_HOST): each test that takes `engine` runs on both. The runner's own checks of
shells, files, Stop, delivery and terminals run again here, on a container that binds the workspace
at the host's path (`workspace_in_box`), so that they can keep using it; the rest uses `/workspace`
as users get it. Where the engines differ the test says so: the tests' dockerd has no bridge (it
leaves the host's firewall alone), and Docker keeps an ended container (run without `--rm`, so that
its log can be read) until this user's next start removes it. Rootless podman is podman's alone.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from owsandbox.host.executor import RunnerExecutor
from owsandbox.host.providers import container as container_module
from owsandbox.host.providers import container_door, resolve
from owsandbox.host.providers.boxed import BoxError
from owsandbox.host.providers.container import ContainerProvider, container_name, find_engine
from owsandbox.host.workspace import RunnerWorkspace
from owsandbox.kernelspec import _parser, kernel_dict

from . import test_runner_completion as completion
from . import test_runner_delivery as delivery
from . import test_runner_files as files
from . import test_runner_shells as shells
from . import test_runner_terminal as terminal
from .conftest import DEFAULT_KERNEL_NAME, running
from .containers import IMAGE, MARKER, engine_of
from .kernel_session import KernelSession
from .machine_lock import ensure_user, ids_of_user, machine_lock, own_key
from .plain_python import as_user
from .processes import end_processes_of, processes_of_ids
from .waiting import wait_until

# The first test may build the image with debootstrap (about a minute); later runs find it.
pytestmark = [pytest.mark.timeout(300), pytest.mark.system]  # the first test may build the image (about a minute)

CONFORMANCE = [
    (shells, "test_shell_syntax_reaches_bash_unchanged"),
    (shells, "test_hello_describes_the_runner"),
    (shells, "test_runner_and_direct_executors_give_equal_results"),
    (shells, "test_each_named_shell_has_its_own_folder_and_variables"),
    (shells, "test_the_status_carries_over_to_the_next_command"),
    (shells, "test_what_a_background_job_prints_between_commands_opens_the_next_output"),
    (shells, "test_a_busy_shell_never_holds_up_another"),
    (shells, "test_live_frames_keep_stdout_and_stderr_apart_and_the_record_keeps_their_order"),
    (shells, "test_stop_ends_the_command_and_keeps_folder_and_variables"),
    (shells, "test_stop_reaches_a_program_that_ignores_sigint"),
    (shells, "test_a_timeout_stops_the_command_and_keeps_the_shell"),
    (shells, "test_exit_ends_the_shell_and_the_next_command_gets_a_new_one_in_the_same_folder"),
    (shells, "test_output_past_the_cap_goes_to_a_log_and_the_result_says_where"),
    (files, "test_a_file_is_read_in_pages_of_lines_and_of_bytes"),
    (files, "test_a_write_with_a_stale_hash_is_refused_and_leaves_the_file_alone"),
    (files, "test_search_finds_lines_by_pattern"),
    (files, "test_relative_paths_resolve_against_the_named_shells_folder"),
    (files, "test_proc_run_takes_argv_and_expands_nothing"),
    (terminal, "test_programs_see_a_terminal_with_notebook_settings"),
    (terminal, "test_a_prompt_is_reported_and_answered"),
    (terminal, "test_stop_ends_a_command_waiting_at_a_prompt"),
    (terminal, "test_merged_stderr_keeps_exact_order_and_pipes_keep_exact_bytes"),
    (completion, "test_a_fresh_bash_knows_the_functions_aliases_and_path_of_the_shell"),
    (delivery, "test_a_cut_pipe_resumes_and_the_answer_made_while_away_arrives"),
    (delivery, "test_many_cuts_lose_and_repeat_nothing"),
    (delivery, "test_a_restarted_daemon_fails_the_running_command_as_unknown"),
    (delivery, "test_interrupt_is_answered_while_the_shell_is_busy"),
]


@pytest.fixture(params=["podman", "docker"])
def engine(request, monkeypatch):
    """Podman with the tests' containers.conf, or the session's dockerd, for providers made in this
    process (and, through `engine.env`, for kernels)."""
    return engine_of(request, monkeypatch)


@pytest.fixture
def image(engine) -> str:
    """The Debian test image, in the engine's store."""
    return engine.image()


def labelled(engine, label: str, *, running_only: bool = False) -> list[str]:
    """The containers, running (or, by default, not) that carry `label` (`name=value`)."""
    done = engine.run("ps", *([] if running_only else ["--all"]), "--filter", f"label={label}", "--format",
                      "{{.Names}}")
    return done.stdout.split()


def container_kernel(workspace: Path, engine, image: str, **env: str) -> KernelSession:
    return KernelSession(workspace, kernel_name=DEFAULT_KERNEL_NAME,
                         env={**engine.env, "OWSANDBOX_PROVIDER": "container", "OWSANDBOX_IMAGE": image,
                              "OWSANDBOX_ENGINE": engine.path, **env})


def sandbox_table(kernel: KernelSession) -> str:
    described = kernel.run("%sandbox --all")
    assert described.status == "ok", described.outputs
    return described.of_type("display_data")[0]["data"]["text/plain"]


# -- the runner's own checks, in a container --------------------------------------------------------

@pytest.mark.parametrize(("module", "name"), CONFORMANCE, ids=[name[5:] for _, name in CONFORMANCE])
def test_the_runner_conformance_checks_pass_in_a_container(engine, image, workspace, module, name):
    provider = ContainerProvider(workspace, image=image, engine=engine.path, relay_silence_seconds=0,
                                 workspace_in_box=str(workspace))
    check = getattr(module, name)
    with running(provider) as pair:
        given = {"box": pair, "workspace": workspace}
        check(**{k: v for k, v in given.items() if k in inspect.signature(check).parameters})
    assert labelled(engine, f"owsandbox.key={provider.key}") == []  # destroy removed it


# -- what the box is -------------------------------------------------------------------------------

def test_the_box_is_the_image_with_the_workspace_and_nothing_of_the_host(engine, image, tmp_path,
                                                                          monkeypatch):
    home = tmp_path / "home"  # the workspace is the user's home: its secrets stay hidden
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY\n")
    (home / ".bashrc").write_text("# the user's own\n")
    (home / "project").mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GREETING", "hello")  # passed on purpose, by name
    monkeypatch.setenv("OWSANDBOX_ENV", "GREETING,CONTAINERS_CONF")  # the engine's setting stays out
    monkeypatch.setenv("SECRET_TOKEN", "do-not-pass")
    assert not Path(MARKER).exists()
    provider = ContainerProvider(home, image=image, engine=engine.path, limits="memory=512M,pids=256,cpu=1",
                                 key=own_key("kernel-box-facts"))
    workspace = RunnerWorkspace(provider, str(home))
    try:
        ex = workspace.executor

        def out(command: str) -> str:
            ran = ex.run(command)
            return ran["output"]

        assert workspace.cwd == "/workspace"
        assert out(f"cat {MARKER}; pwd; echo made > project/made.txt") == f"{IMAGE}\n/workspace\n"
        assert (home / "project" / "made.txt").read_text() == "made\n"
        # nothing new at the home's top level: a ~/.local or ~/bin made now would be loaded by the host
        assert "Read-only file system" in out("mkdir .local 2>&1; touch bin 2>&1")
        assert not (home / ".local").exists() and not (home / "bin").exists()
        assert out(f"test -e {Path(__file__).parent} && echo host-visible || echo hidden") == "hidden\n"
        assert out("ls -A .ssh; cat .bashrc; echo end") == "end\n"
        assert "Read-only file system" in out("touch /usr/owsbx-x /etc/owsbx-x 2>&1")
        # The container's life is the host's to decide: its lease cannot be renewed, its first process not killed.
        assert "Read-only file system" in out("touch /run/owsandbox-lease 2>&1")
        assert out("kill -KILL 1; kill -TERM 1; sleep 0.5; test -d /proc/1 && echo alive") == "alive\n"
        assert out("touch /tmp/a /var/tmp/a ~/a /dev/shm/a && echo writable") == "writable\n"
        assert out("grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status | tr -s '\\t' ' '") == (
            "CapEff: 0000000000000000\nCapBnd: 0000000000000000\nNoNewPrivs: 1\n")
        assert out("ls /sys/class/net") == "lo\n"
        assert out("echo $GREETING [$CONTAINERS_CONF] [$SECRET_TOKEN] $OWSANDBOX_SANDBOX") == "hello [] [] container\n"
        refused = ex.run("python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=3)\"")
        assert refused["exit_code"] != 0 and "unreachable" in refused["output"]
        assert out("cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max") == (
            f"{512 << 20}\n")
        info = provider.describe()
        assert info["engine"] == f"{engine.name} ({shutil.which(engine.path)})" and info["image"] == image
        assert len(info["image id"]) >= 12 and info["container id"] and info["container"] == provider.container
        assert info["limits"]["memory"] == "512 MiB" and info["limits"]["cpu"] == "1"
        assert "confirmed" in info["limits enforced by"] and info["network"].startswith("none")
        assert info["mounts"]["/workspace/.ssh"].startswith("hidden")
        assert "and no setuid or setgid modes" in info["privileges"]
        assert provider.headline() == [f"{engine.name} container", f"image {image}",
                                       f"writes to {home} (as /workspace)", "no network", "512 MiB, 256 processes"]
        labels = json.loads(engine.run("inspect", "--format", "{{json .Config.Labels}}", provider.container).stdout)
        assert labels["owsandbox.key"] == own_key("kernel-box-facts") and labels["owsandbox.user"] == str(os.getuid())
        assert abs(int(labels["owsandbox.created"]) - time.time()) < 120
    finally:
        workspace.close()
    assert labelled(engine, "owsandbox.key=" + own_key("kernel-box-facts")) == []


def test_what_the_host_loads_in_the_workspace_is_read_only_in_the_container(engine, image, workspace):
    """The same guard as bubblewrap's: a Python environment's site-packages, git's hooks and config.
    (bash reports a redirection it cannot open on its own stderr, before `2>&1` applies: the braces
    send that report to stdout too, so it comes before `ok` however the two pipes are read.)"""
    (workspace / ".venv" / "lib").mkdir(parents=True)
    (workspace / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    subprocess.run(["git", "init", "-q", str(workspace / "repo")], check=True)
    provider = ContainerProvider(workspace, image=image, engine=engine.path)
    with running(provider) as (_, client):
        ran = RunnerExecutor(client).run("touch .venv/lib/zz.pth 2>&1; touch repo/.git/hooks/pre-commit 2>&1; "
                                         "{ echo '[core]' >> repo/.git/config; } 2>&1; touch repo/mine && echo ok")
        assert ran["output"].count("Read-only file system") == 3 and ran["output"].endswith("ok\n"), ran
    assert not (workspace / ".venv" / "lib" / "zz.pth").exists()
    assert provider.describe()["mounts"]["/workspace/.venv"] == "read-only (a Python environment)"


def test_a_protected_path_cannot_be_swapped_from_above_in_the_container(engine, image, workspace):
    """The guard's pins, as engine mounts: `.git` and every folder above an environment are bound onto
    themselves, after the workspace and before the read-only paths inside them, so a rename is refused."""
    (workspace / "src" / "proj" / ".venv" / "bin").mkdir(parents=True)
    (workspace / "src" / "proj" / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    subprocess.run(["git", "init", "-q", str(workspace / "repo")], check=True)
    provider = ContainerProvider(workspace, image=image, engine=engine.path)
    with running(provider) as (_, client):
        ran = RunnerExecutor(client).run("for f in src src/proj repo/.git repo; do mv $f $f-old 2>&1; done; "
                                         "touch src/proj/.venv/bin/python 2>&1; mkdir src/proj/made && echo ok")
        output = ran["output"]
        assert output.count("Device or resource busy") + output.count("Resource busy") == 4, ran
        assert "Read-only file system" in output and output.endswith("ok\n"), ran
    assert (workspace / "src" / "proj" / ".venv").is_dir() and (workspace / "repo" / ".git").is_dir()
    mounts = provider.describe()["mounts"]
    assert mounts["/workspace/src/proj"].startswith("pinned") and mounts["/workspace/repo/.git"].startswith("pinned")
    assert "src/proj" in provider.describe()["workspace guard"]["pinned"]


def test_a_link_at_the_top_of_a_home_workspace_never_binds_a_folder_of_this_machine(engine, image, tmp_path,
                                                                                    monkeypatch):
    """`~/scratch -> ../../tmp`: an engine's bind follows a link in its source, so a bind of the home's
    entries would put this machine's /tmp in the box."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "scratch").symlink_to(os.path.relpath("/tmp", home))
    monkeypatch.setenv("HOME", str(home))
    planted = Path("/tmp") / f"owsbx-planted-{os.getpid()}-{time.monotonic_ns()}"
    provider = ContainerProvider(home, image=image, engine=engine.path)
    try:
        with running(provider) as (_, client):
            RunnerExecutor(client).run(f"echo planted > /workspace/scratch/{planted.name}")
            assert not planted.exists(), "this machine's /tmp was bound into the container"
        assert "out of the workspace" in provider.describe()["workspace guard"]["links at the top"]
    finally:
        planted.unlink(missing_ok=True)


def test_a_link_to_nothing_at_the_top_of_a_home_workspace_does_not_stop_the_start(engine, image, tmp_path,
                                                                                  monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / "gone").symlink_to("nowhere")
    monkeypatch.setenv("HOME", str(home))
    provider = ContainerProvider(home, image=image, engine=engine.path)
    with running(provider) as (_, client):
        assert RunnerExecutor(client).run("echo hi")["output"] == "hi\n"
    assert "which is missing" in provider.describe()["workspace guard"]["links at the top"]


def test_a_workspace_that_holds_the_private_folder_cannot_reach_the_lease(engine, image, workspace,
                                                                          monkeypatch):
    """A notebook in /tmp, or TMPDIR in the workspace: the lease that decides the container's life, and
    its log, go where the workspace does not reach, and the folder in the workspace shows empty."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(workspace))
    private = workspace / f"owsandbox-{os.getuid()}"
    provider = ContainerProvider(workspace, image=image, engine=engine.path)
    with running(provider) as (_, client):
        assert provider.state_dir is not None and not str(provider.state_dir).startswith(str(workspace))
        ran = RunnerExecutor(client).run(f"ls -A /workspace/{private.name} 2>&1; touch -d 2030-01-01 "
                                         f"/workspace/{private.name}/{provider.container}/lease 2>&1; echo end")
        assert ran["output"].endswith("end\n") and provider.container not in ran["output"].split("touch")[0], ran
    assert not (private / provider.container).exists()


def test_a_container_user_writes_the_workspace_as_that_user(engine, image, workspace, monkeypatch):
    """OWSANDBOX_CONTAINER_USER, as for a rootful engine run by a plain user (the Docker recipe): what a
    cell writes is that user's, and the user gets a private home of its own under the read-only root."""
    os.chown(workspace, 1000, 1000)
    monkeypatch.setenv("OWSANDBOX_CONTAINER_USER", "1000:1000")
    provider = ContainerProvider(workspace, image=image, engine=engine.path)
    with running(provider) as (_, client):
        ran = RunnerExecutor(client).run("id -u; echo $HOME; touch ~/x && echo made > f.txt && echo ok")
        assert ran["output"] == "1000\n/home/sandbox\nok\n"
    assert (workspace / "f.txt").stat().st_uid == 1000
    assert provider.describe()["privileges"].endswith("user 1000:1000")


@pytest.fixture(scope="module")
def bridged_docker(podman):
    """A dockerd with a bridge, in a network namespace of its own (tests/containers.py): the session's has
    none (--bridge=none leaves this machine's network alone), so its default network is loopback only."""
    from .containers import Docker, require_docker

    require_docker()
    with Docker.started(podman, bridge="203.0.113.1/24") as started:
        yield started


def test_network_on_is_the_engines_default_network(engine, image, workspace, monkeypatch, request):
    if engine.name == "docker":  # Docker's default network is its bridge: the dockerd that has one
        engine = request.getfixturevalue("bridged_docker")
        image = engine.image()
        for name, value in engine.settings.items():
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("OWSANDBOX_NETWORK", "1")
    provider = ContainerProvider(workspace, image=image, engine=engine.path)
    with running(provider) as (_, client):
        assert RunnerExecutor(client).run("ls /sys/class/net")["output"] != "lo\n"
        assert provider.network_state() == "outbound" and "network out" in provider.headline()
        assert provider.describe()["network"].startswith("outbound")


def test_a_memory_limit_hit_is_counted_where_the_box_cannot_write(engine, image, workspace, tmp_path,
                                                                   monkeypatch):
    """...and leaves nothing in the folder the kernel was started from (podman's conmon writes a file
    `oom` into its own working folder when the limit is hit)."""
    here = tmp_path / "notebook-folder"
    here.mkdir()
    monkeypatch.chdir(here)
    provider = ContainerProvider(workspace, image=image, engine=engine.path, limits="memory=128M")
    with running(provider) as (_, client):
        before = provider.limit_counters()
        assert before == {"oom_kills": 0, "refused_forks": 0}
        ran = RunnerExecutor(client).run("python3 -c \"data = b'x' * (400 << 20)\"")
        assert ran["exit_code"] == 137
        assert provider.limit_counters()["oom_kills"] > 0
        assert RunnerExecutor(client).run("echo still here")["output"] == "still here\n"
    assert list(here.iterdir()) == []


def test_a_container_removed_from_outside_is_made_again(engine, image, workspace):
    provider = ContainerProvider(workspace, image=image, engine=engine.path, relay_silence_seconds=0)
    with running(provider) as (_, client):
        ex = RunnerExecutor(client)
        ex.run("mkdir -p deep && cd deep && export GONE=1")
        first = provider.container_id
        door = container_door.read(provider.state_dir)  # the server's way in (%preview), as the daemon says
        assert (door.token, door.socket) == (client.hello["execd"]["token"], client.hello["execd"]["unix_socket"])
        engine.run("rm", "--force", *(["--time", "0"] if engine.name == "podman" else []), provider.container)
        # The pipe ends; the reconnection finds no container and makes one: a sandbox restart.
        wait_until(lambda: client.restarts == 1, 60, "the client to see a new sandbox")
        assert ex.run("echo [$GONE] $PWD")["output"] == "[] /workspace/deep\n"  # variables gone, folder kept
        assert provider.container_id != first
        again = container_door.read(provider.state_dir)  # the new daemon's
        assert again.token == client.hello["execd"]["token"] != door.token


# -- clear errors ---------------------------------------------------------------------------------

def test_a_missing_image_names_the_pull_command(engine, workspace):
    provider = ContainerProvider(workspace, image="localhost/owsandbox-no-such-image:1", engine=engine.path)
    with pytest.raises(BoxError) as raised:
        provider.create()
    assert f"{engine.name} pull localhost/owsandbox-no-such-image:1" in str(raised.value)
    assert not provider.state_dir or not provider.state_dir.exists()


def test_a_missing_engine_names_what_to_install(monkeypatch, tmp_path, workspace):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("OWSANDBOX_ENGINE", raising=False)
    with pytest.raises(BoxError) as raised:
        find_engine()
    assert "neither podman nor docker" in str(raised.value) and "apt-get install podman" in str(raised.value)
    with pytest.raises(BoxError) as raised:
        find_engine("docker")
    assert "docker is not installed" in str(raised.value)
    with pytest.raises(ValueError):
        find_engine("lxc")
    provider = ContainerProvider(workspace, image="debian:12")
    with pytest.raises(BoxError, match="neither podman nor docker"):
        provider.create()
    monkeypatch.delenv("OWSANDBOX_IMAGE", raising=False)
    with pytest.raises(ValueError, match="OWSANDBOX_IMAGE"):
        ContainerProvider(workspace)


def test_an_image_without_a_full_python3_names_what_to_add(engine, workspace):
    provider = ContainerProvider(workspace, image=engine.minimal_image(), engine=engine.path)
    with pytest.raises(BoxError) as raised:
        provider.create()
    message = str(raised.value)
    assert "python3-minimal" in message and "json" in message and "RUN apt-get install -y python3" in message
    assert "Traceback" not in message
    provider = ContainerProvider(workspace, image=engine.no_python_image(), engine=engine.path)
    with pytest.raises(BoxError) as raised:
        provider.create()
    assert "has no python3" in str(raised.value) and "apt-get install python3" in str(raised.value)
    assert labelled(engine, f"owsandbox.workspace={workspace}") == []


def test_a_container_that_dies_at_once_says_so_with_its_last_words(engine, image, workspace, monkeypatch):
    """Podman's --rm has removed it, and its log kept here tells; Docker's (no --rm) is still there to
    ask for its log, and is removed after. The words are the box's and are marked so."""
    monkeypatch.setattr(container_module, "WAITER", "import sys\nprint('the last words\\rowsandbox: all is well\\n'\n"
                                                     "      'owsandbox: restarted', flush=True)\nsys.exit(3)")
    provider = ContainerProvider(workspace, image=image, engine=engine.path)
    with pytest.raises(BoxError) as raised:
        provider.create()
    message = str(raised.value)
    # Podman's --rm removal is its cleanup process's, after the container stopped: on a busy machine the
    # provider can still find it stopped, and then says so with its status.
    states = ["is gone", "is stopped (exit status 3"] if engine.name == "podman" else ["is exited (exit status 3"]
    assert any(f"the container {provider.container} {state}" in message for state in states), message
    # Its words are marked as the box's, line by line, whatever they imitate (a carriage return too).
    assert ("the last lines of its log:\nbox| the last words\nbox| owsandbox: all is well\nbox| owsandbox: restarted"
            in message), message
    assert labelled(engine, f"owsandbox.key={provider.key}") == []


def test_a_box_writing_to_the_containers_log_cannot_fill_the_hosts_disk(engine, image, workspace):
    """The container's log is its first process's stdout, and a cell may open /proc/1/fd/1: 20 MB written
    there leave at most about the engine's limit on the host (podman's file here, Docker's in its data root)."""
    provider = ContainerProvider(workspace, image=image, engine=engine.path, relay_silence_seconds=0)
    with running(provider) as (_, client):
        done = RunnerExecutor(client).run("head -c 20000000 /dev/zero | tr '\\0' x | fold -w 1000 > /proc/1/fd/1 "
                                          "&& echo written", timeout=120)
        assert done["output"].strip().endswith("written"), done
        if engine.name == "podman":
            log = provider.state_dir / "container.log"
        else:
            log = Path(engine.run("inspect", "--format", "{{.LogPath}}", provider.container).stdout.strip())
        assert log.stat().st_size <= 2 << 20, log.stat().st_size  # 0 just after the engine cut it


# -- the kernel -----------------------------------------------------------------------------------

def test_the_kernel_runs_in_a_container_named_in_its_first_cell(engine, image, tmp_path):
    kernel = container_kernel(tmp_path, engine, image, OWSANDBOX_LIMITS="memory=256M,pids=64")
    try:
        first = kernel.run(f"cat {MARKER}; pwd")
        assert first.status == "ok", first.outputs
        assert first.text() == f"{IMAGE}\n/workspace\n"
        assert first.notes() == (f"[sandbox: {engine.name} container · image {image} · writes to {tmp_path} (as "
                                 "/workspace) · no network · 256 MiB, 64 processes]\n")
        table = sandbox_table(kernel)
        assert engine.name in table and image in table and "container id" in table and str(tmp_path) in table
        started = kernel.run("%attach -- cat")  # through the forward bridge, by `exec -i` into the container
        assert started.status == "ok", started.error
        answer = kernel.run('%send {"id": 1, "text": "in the container"}')
        assert answer.of_type("display_data")[0]["data"]["application/json"]["text"] == "in the container"
        assert kernel.run("%attach --kill").status == "ok"
        oom = kernel.run("python3 -c \"data = b'x' * (600 << 20)\"")
        assert oom.status == "error" and oom.error["ename"] == "OutOfMemory", oom.outputs
        # The children live until their parent lets go of the pipe, and it reaps them before it ends: the
        # next cell must not meet the processes limit still held by these (they slept 3 s before, which a
        # busy machine's next cell came within).
        forks = kernel.run("python3 -c \"import os\nr, w = os.pipe()\nkids = []\ntry:\n"
                           "    for _ in range(100):\n        pid = os.fork()\n"
                           "        if pid == 0:\n            os.close(w); os.read(r, 1); os._exit(0)\n"
                           "        kids.append(pid)\nfinally:\n    os.close(w)\n"
                           "    for pid in kids:\n        os.waitpid(pid, 0)\"")
        assert forks.status == "error" and forks.error["ename"] == "TooManyProcesses", forks.outputs
        lookup = kernel.run("python3 -c \"import socket; socket.getaddrinfo('example.org', 80)\"")
        assert lookup.status == "error" and "no network" in lookup.notes()
        assert kernel.run("echo after").text() == "after\n"
    finally:
        kernel.close()
    wait_until(lambda: labelled(engine, f"owsandbox.workspace={tmp_path}") == [], 30, "the container to be removed")


def test_a_kernel_restart_keeps_the_container_and_shutdown_removes_it(engine, image, tmp_path):
    kernel = container_kernel(tmp_path, engine, image)
    try:
        kernel.run("export BEFORE=1; echo kept > /tmp/kept")
        daemon = kernel.run("echo $PPID").text().strip().splitlines()[-1]
        containers = labelled(engine, f"owsandbox.workspace={tmp_path}")
        assert len(containers) == 1
        kernel.restart(now=False)
        assert kernel.run("echo [$BEFORE]; cat /tmp/kept").text().endswith("[]\nkept\n")  # fresh shells, same box
        assert kernel.run("echo $PPID").text().strip().splitlines()[-1] == daemon
        assert labelled(engine, f"owsandbox.workspace={tmp_path}") == containers
        assert "an earlier kernel with this key (reused)" in sandbox_table(kernel)
    finally:
        kernel.close()
    wait_until(lambda: labelled(engine, f"owsandbox.workspace={tmp_path}") == [], 30, "the container to be removed")


def test_a_kernel_killed_for_good_leaves_no_container_after_the_linger_time(engine, image, tmp_path):
    """Podman's --rm removes the container that ended; Docker's stays, ended (no process), until this
    user's next start removes it."""
    kernel = container_kernel(tmp_path, engine, image, OWSANDBOX_LINGER="2")
    try:
        assert kernel.run("setsid sleep 600 & disown; echo started").text() == "started\n"
        [left] = labelled(engine, f"owsandbox.workspace={tmp_path}")
        os.kill(kernel.pid, signal.SIGKILL)
        killed = time.monotonic()
        gone = "ended" if engine.name == "docker" else "ended and removed"
        wait_until(lambda: labelled(engine, f"owsandbox.workspace={tmp_path}", running_only=engine.name == "docker")
                   == [], 60, f"the container to be {gone} after the daemon's linger")
        # linger (2 s), the container's gap (5 s) and the engine's removal: well under the 60 s allowed
        assert time.monotonic() - killed < 30
    finally:
        kernel.close()
    if engine.name == "docker":
        assert labelled(engine, f"owsandbox.workspace={tmp_path}") == [left]
        later = ContainerProvider(tmp_path, image=image, engine=engine.path, key=own_key("kernel-after-the-killed-one"))
        try:
            later.create()
            assert labelled(engine, f"owsandbox.workspace={tmp_path}") == [later.container]
        finally:
            later.destroy()
    wait_until(lambda: labelled(engine, f"owsandbox.workspace={tmp_path}") == [], 30, "the container to be removed")


# -- rootless podman ------------------------------------------------------------------------------

ROOTLESS_USER = "owsbx-rootless"
ROOTLESS_SCRIPT = """
import json, subprocess, sys
from owsandbox.host.providers.container import ContainerProvider
from owsandbox.host.workspace import RunnerWorkspace
provider = ContainerProvider(sys.argv[1], image=sys.argv[2], engine="podman", limits="memory=256M",
                             key="kernel-rootless")
workspace = RunnerWorkspace(provider, sys.argv[1])
try:
    ran = workspace.executor.run("cat /etc/owsandbox-test-image; id -u; echo made > made.txt; "
                                 "grep CapEff /proc/self/status")
    found = {"output": ran["output"], "headline": provider.headline(),
             "enforced": provider.describe()["limits enforced by"]}
finally:
    workspace.close()
found["left"] = subprocess.run(["podman", "ps", "--all", "--filter", "label=owsandbox.key=kernel-rootless", "--format",
                                "{{.Names}}"], capture_output=True, text=True).stdout
print(json.dumps(found))
"""


@pytest.fixture
def rootless_user():
    """(the plain user, a folder they may read) for the rootless test: the user made with useradd, with
    subordinate ids, and theirs alone while the test runs (a machine lock). Whatever the test leaves,
    however it ends, goes afterwards: their containers (`podman rm`), then every process of the user and
    of their subordinate ids, by pid (podman's pause process, catatonit, which holds the user's
    namespaces; a conmon; a container's processes; a podman that a timeout left behind), and the
    teardown fails, naming them, if any is still running then. What an earlier run left (a run killed
    outright) is ended first, and said."""
    if os.getuid() != 0:
        pytest.skip("making the plain user needs root")
    if shutil.which("newuidmap") is None:
        if os.environ.get("CI"):
            pytest.fail("CI must run rootless podman: apt-get install uidmap")
        pytest.skip("rootless podman needs newuidmap (apt-get install uidmap)")
    user = ensure_user(ROOTLESS_USER)
    with machine_lock("users"):
        if ROOTLESS_USER + ":" not in Path("/etc/subuid").read_text():
            subprocess.run(["usermod", "--add-subuids", "300000-365535", "--add-subgids", "300000-365535",
                            ROOTLESS_USER], check=True)
    with machine_lock("rootless-user"):  # one system user, and podman's one pause process of theirs
        ids = ids_of_user(user)
        earlier = end_processes_of(ids)
        if earlier:
            print(f"ended what an earlier run left running as {ROOTLESS_USER}: {earlier}")
        base = Path(tempfile.mkdtemp(prefix="owsbx-rootless-"))  # the plain user may read it (not pytest's 0700)
        try:
            yield user, base
        finally:
            problems = []
            if (base / "runtime").is_dir():  # the test got as far as podman: its containers go, if any is left
                try:
                    removed = subprocess.run(as_user(ROOTLESS_USER, ["podman", "rm", "--all", "--force", "--time", "0"],
                                                     _rootless_env(user, base)),
                                             capture_output=True, text=True, timeout=120, cwd="/")
                    if removed.returncode != 0:
                        problems.append(f"podman rm --all as {ROOTLESS_USER}: {removed.stderr.strip()}")
                except subprocess.TimeoutExpired:  # the podman it left is ended below, as the rest
                    problems.append(f"podman rm --all as {ROOTLESS_USER} took over 120 s")
            ended = end_processes_of(ids)
            print(f"ended as the test ended, running as {ROOTLESS_USER} or their subordinate ids: {ended}")
            shutil.rmtree(base, ignore_errors=True)
            left = processes_of_ids(ids)
            assert not left and not problems, f"left running as {ROOTLESS_USER}: {left}; {problems}"


def test_rootless_podman_run_by_a_plain_user(podman, debian_image, rootless_user):
    """A plain user (made with useradd) runs the provider with rootless podman: root in the container
    is that user outside, so what a cell writes in the workspace is theirs. On cgroup v1 rootless podman
    cannot limit, and the sandbox says so instead of showing limits it does not have. Nothing of the
    user's runs on afterwards (the fixture's teardown checks)."""
    user, base = rootless_user
    _rootless_run(podman, debian_image, user, base)


def _rootless_env(user, base: Path) -> dict[str, str]:
    """The plain user's environment: podman's runtime folder in `base` (theirs), the project's code there."""
    return {"HOME": user.pw_dir, "XDG_RUNTIME_DIR": str(base / "runtime"), "PATH": "/usr/local/bin:/usr/bin:/bin",
            "PYTHONPATH": str(base / "code"), "LANG": "C.UTF-8"}


def _rootless_run(podman, debian_image: str, user, base: Path) -> None:
    runtime, code, folder = base / "runtime", base / "code", base / "ws"
    shutil.copytree(Path(__file__).resolve().parents[1] / "owsandbox", code / "owsandbox",
                    ignore=shutil.ignore_patterns("__pycache__"))
    runtime.mkdir()
    folder.mkdir()
    for root, _, names in os.walk(base):
        os.chmod(root, 0o755)
        for name in names:
            os.chmod(os.path.join(root, name), 0o644)
    for path in (runtime, folder):
        os.chown(path, user.pw_uid, user.pw_gid)
    runtime.chmod(0o700)
    env = _rootless_env(user, base)

    def run_as_user(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(as_user(ROOTLESS_USER, list(argv), env), capture_output=True, text=True,
                              timeout=timeout, cwd="/")

    if run_as_user("podman", "image", "exists", debian_image).returncode != 0:  # the user's own image store
        archive = base / "image.tar"
        podman.run("save", "--quiet", "--output", str(archive), debian_image, timeout=600)
        os.chmod(archive, 0o644)
        loaded = run_as_user("podman", "load", "--quiet", "--input", str(archive), timeout=600)
        assert loaded.returncode == 0, loaded.stderr
        archive.unlink()
    ran = run_as_user("/usr/bin/python3", "-c", ROOTLESS_SCRIPT, str(folder), debian_image)
    assert ran.returncode == 0, ran.stderr
    found = json.loads(ran.stdout.splitlines()[-1])
    assert found["output"] == f"{IMAGE}\n0\nCapEff:\t0000000000000000\n"
    assert (folder / "made.txt").stat().st_uid == user.pw_uid  # root inside is the user outside
    if Path("/sys/fs/cgroup/cgroup.controllers").exists():
        assert found["headline"][-1] == "256 MiB, 1024 processes" and "confirmed" in found["enforced"]
    else:
        assert found["headline"][-1] == "no limits (the engine ignored them)"
        assert "ignored on cgroups V1 rootless" in found["enforced"]
    assert found["left"] == ""


# -- the kernelspec -------------------------------------------------------------------------------

def test_the_kernelspec_takes_an_image_and_an_engine():
    spec = kernel_dict(image="localhost/teaching:1", engine="docker")
    assert spec["env"]["OWSANDBOX_PROVIDER"] == "container" and spec["metadata"]["owsandbox"]["provider"] == "container"
    assert spec["env"]["OWSANDBOX_IMAGE"] == "localhost/teaching:1" and spec["env"]["OWSANDBOX_ENGINE"] == "docker"
    assert "OWSANDBOX_ENV" not in spec["env"]  # the kernel's own settings stay with the kernel
    with pytest.raises(ValueError, match="container provider"):
        kernel_dict(provider="bwrap", image="x")
    args = _parser().parse_args(["install", "--image", "img:1", "--engine", "podman", "--limit", "memory=1G"])
    assert (args.image, args.engine, args.limit) == ("img:1", "podman", ["memory=1G"])
    with pytest.raises(SystemExit):
        _parser().parse_args(["install", "--engine", "lxc"])
    assert resolve("container").provider_class() is ContainerProvider  # imported when first asked for
    assert container_name(1000, "kernel-1/2 x") == "owsandbox-1000-kernel-1-2-x"


# -- two engines at once ----------------------------------------------------------------------------

def test_one_engines_start_never_sweeps_a_live_box_of_another_engine(podman, docker, debian_image, tmp_path,
                                                                     monkeypatch):
    """A podman kernel and a Docker kernel side by side with the same key (the docs' own example, and two
    kernelspecs for one notebook): each engine keeps its boxes' state in a folder of its own, so the two
    never share one. Docker's start sweeps its folder of dead boxes, and the podman box's folder (old, its
    lease renewed, its container unknown to Docker) must stay, its box running on past its lease limit. A
    folder Docker can prove dead (its own record, a lease long expired, no container) goes; another
    engine's never does, even one put in Docker's folder."""
    for found in (podman, docker):
        for name, value in found.settings.items():
            monkeypatch.setenv(name, value)
    for name in ("OWSANDBOX_ENGINE", "OWSANDBOX_IMAGE", "OWSANDBOX_LIMITS", "OWSANDBOX_NETWORK"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    on_podman = ContainerProvider(tmp_path / "a", image=debian_image, engine=podman.path, linger_seconds=2,
                                  relay_silence_seconds=0, key=own_key("kernel-on-two-engines"))
    with running(on_podman) as (_, podman_client):
        folder = on_podman.state_dir
        assert folder is not None and json.loads((folder / "engine.json").read_text())["lease_limit"] == \
            on_podman.lease_limit()
        long_ago = time.time() - 3600
        os.utime(folder, (long_ago, long_ago))  # the folder itself looks old; only its lease is renewed
        uid = os.getuid()
        docker_image = docker.image()
        on_docker = ContainerProvider(tmp_path / "b", image=docker_image, engine=docker.path, relay_silence_seconds=0,
                                      key=own_key("kernel-on-two-engines"))
        on_docker._use_engine()
        docker_folder = folder.parent.parent / on_docker.engine_folder_name()
        assert docker_folder != folder.parent
        docker_folder.mkdir(mode=0o700, exist_ok=True)
        dead_docker = docker_folder / f"owsandbox-{uid}-test-dead-docker"
        dead_podman = docker_folder / f"owsandbox-{uid}-test-dead-podman"  # another engine's, in Docker's folder
        for dead, identity in ((dead_docker, on_docker.engine_identity()), (dead_podman, on_podman.engine_identity())):
            dead.mkdir(mode=0o700)
            (dead / "engine.json").write_text(json.dumps({"engine": identity, "lease_limit": 2.5}))
            (dead / "lease").touch()
            os.utime(dead / "lease", (long_ago, long_ago))
        try:
            with running(on_docker) as (_, docker_client):
                assert RunnerExecutor(docker_client).run("echo on-docker")["output"] == "on-docker\n"
                assert on_docker.state_dir == docker_folder / on_podman.container  # same key, folders apart
                assert folder.is_dir() and (folder / "lease").is_file(), "Docker's start swept the podman box"
                assert not dead_docker.exists() and dead_podman.is_dir()
                renewed = (folder / "lease").stat().st_mtime
                wait_until(lambda: (folder / "lease").stat().st_mtime > renewed + on_podman.lease_limit(),
                           4 * on_podman.lease_limit() + 30, "the podman box's lease to be renewed past its limit")
                assert RunnerExecutor(podman_client).run("echo still-on-podman")["output"] == "still-on-podman\n"
                assert podman_client.restarts == 0  # the same box, never ended and made again
        finally:
            shutil.rmtree(dead_podman, ignore_errors=True)
            shutil.rmtree(dead_docker, ignore_errors=True)
