"""The box is one standard-library-only file named by its content, runnable by any python3."""

from __future__ import annotations

import ast
import importlib.util
import json
import marshal
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from owsandbox.host import bundle
from owsandbox.host.bundle import box_sources, build_runner_zipapp
from owsandbox.host.workspace import DirectWorkspace, RunnerWorkspace, open_workspace

from .machine_lock import own_key
from .test_protocol_shapes_pythons import interpreter


@pytest.mark.unit
def test_the_box_imports_nothing_but_the_standard_library():
    allowed = set(sys.stdlib_module_names) | {"__future__"}
    sources = box_sources()
    assert len(sources) >= 20 and any(path.parent.name == "protocol" for path in sources)
    for source in sources:
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in allowed, f"{source} imports {name}"


@pytest.mark.unit
def test_the_zipapp_is_named_by_its_content_and_reused(tmp_path):
    first = build_runner_zipapp(tmp_path)
    stamp = first.stat().st_mtime_ns
    assert first.name.startswith("runner-") and first.suffix == ".pyz" and len(first.stem) == len("runner-") + 12
    assert build_runner_zipapp(tmp_path) == first and first.stat().st_mtime_ns == stamp
    with zipfile.ZipFile(first) as zf:
        names = set(zf.namelist())
    assert {"__main__.py", "owsandbox/__init__.py", "owsandbox/box/daemon.py", "owsandbox/box/shell/bash.py",
            "owsandbox/box/relay.py", "owsandbox/protocol/__init__.py"} <= names
    assert not any(name.startswith(("owsandbox/host/", "owsandbox/kernel/")) for name in names)
    assert not list(tmp_path.glob(".runner-*"))  # no temp file left behind


@pytest.mark.unit
def test_another_box_gives_another_name(tmp_path, monkeypatch):
    first = build_runner_zipapp(tmp_path / "a")
    package = Path(__file__).resolve().parents[1] / "owsandbox"
    changed = tmp_path / "owsandbox"
    for source in box_sources():
        copy = changed / source.relative_to(package)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(source.read_bytes())
    protocol = changed / "protocol" / "__init__.py"
    protocol.write_text(protocol.read_text() + "\n# changed\n")
    monkeypatch.setattr("owsandbox.host.bundle._ROOT", changed)
    assert build_runner_zipapp(tmp_path / "a").name != first.name


def test_the_zipapp_runs_without_site_packages(zipapp):
    done = subprocess.run([sys.executable, "-S", "-I", str(zipapp), "--help"], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0 and "serve" in done.stdout and "attach" in done.stdout


def test_a_zipapp_for_a_python_holds_its_bytecode_of_each_module_beside_it_under_another_name(tmp_path):
    plain, compiled = build_runner_zipapp(tmp_path), build_runner_zipapp(tmp_path, python=sys.executable)
    assert plain != compiled and compiled.name.startswith("runner-")
    assert build_runner_zipapp(tmp_path, python=sys.executable) == compiled  # the same bytes: reused
    with zipfile.ZipFile(plain) as zf:
        sources = [name for name in zf.namelist() if name.endswith(".py")]
        assert not [name for name in zf.namelist() if name.endswith(".pyc")]
    with zipfile.ZipFile(compiled) as zf:
        names = set(zf.namelist())
        daemon = zf.read("owsandbox/box/daemon.pyc")
    assert {name + "c" for name in sources} <= names and "owsandbox/box/daemon.py" in names
    source = (bundle._ROOT / "box" / "daemon.py").read_bytes()
    assert daemon[:4] == importlib.util.MAGIC_NUMBER and daemon[4:8] == (3).to_bytes(4, "little")  # checked hash
    assert daemon[8:16] == importlib.util.source_hash(source)
    assert marshal.loads(daemon[16:]) == compile(source, "owsandbox/box/daemon.py", "exec", dont_inherit=True)


@pytest.mark.parametrize("python", ["/nonexistent/python3", "/bin/false"])
def test_a_python_that_cannot_compile_leaves_the_zipapp_to_its_sources_and_says_so(tmp_path, python, caplog):
    with caplog.at_level("WARNING", logger="owsandbox.host.bundle"):
        runner = build_runner_zipapp(tmp_path, python=python)
    assert runner == build_runner_zipapp(tmp_path)
    assert f"the runner goes without bytecode, its modules compiled where they run: {python} did not compile" \
        in caplog.text


PROBE = ("import sys; sys.path.insert(0, sys.argv[1]); import owsandbox.box.daemon as d, owsandbox.box.cli as c; "
         "print(d.__file__.rsplit('.', 1)[1], c.quick_parse(['forward', '--socket', '/s']).socket)")


def test_the_python_it_was_made_for_runs_it_from_its_bytecode_and_another_from_the_sources(tmp_path):
    compiled = build_runner_zipapp(tmp_path, python=sys.executable)
    done = subprocess.run([sys.executable, "-S", "-I", "-c", PROBE, str(compiled)], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.split() == ["pyc", "/s"], done.stderr
    others = [python for version in ("3.9", "3.10", "3.12", "3.13") if version != sys.version[:len(version)]
              if (python := interpreter(version)) is not None]
    if not others:
        pytest.skip("no other Python here to read the sources past this one's bytecode")
    for python in others:
        done = subprocess.run([python, "-S", "-I", "-c", PROBE, str(compiled)], capture_output=True, text=True,
                              timeout=60)
        assert done.stdout.split() == ["py", "/s"], (python, done.stderr)
        done = subprocess.run([python, "-S", "-I", "-c", PROBE, str(build_runner_zipapp(tmp_path / python[-4:],
                                                                                          python=python))],
                              capture_output=True, text=True, timeout=60)
        assert done.stdout.split() == ["pyc", "/s"], (python, done.stderr)


def test_the_bytecode_is_the_same_whatever_the_process_that_asks_for_it(tmp_path):
    """The name is the hash of the content, so a runner's bytecode must not change with the hash seed or
    with what the process that asks for it has imported (a kernel has imported much)."""
    build = "import sys{}; from owsandbox.host.bundle import zipapp_bytes; print(zipapp_bytes(sys.executable)[0])"
    names = set()
    for seed, imports in (("1", ""), ("2", ", json, asyncio, typing, email.message, zipfile")):
        done = subprocess.run([sys.executable, "-c", build.format(imports)], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "PYTHONHASHSEED": seed},
                              cwd=str(Path(__file__).resolve().parents[1]))
        assert done.returncode == 0, done.stderr
        names.add(done.stdout.strip())
    assert len(names) == 1


def test_the_console_script_builds_and_runs_the_box(tmp_path):
    built = subprocess.run([sys.executable, "-m", "owsandbox.cli", "runner", "build", "--out", str(tmp_path)],
                           capture_output=True, text=True, timeout=60)
    assert built.returncode == 0
    path = Path(built.stdout.strip())
    assert path.parent == tmp_path and path.exists()
    helped = subprocess.run([sys.executable, "-m", "owsandbox.cli", "runner", "attach", "--help"],
                            capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and "--silence-seconds" in helped.stdout


def test_owsandbox_run_runs_commands_in_a_sandbox(tmp_path):
    done = subprocess.run([sys.executable, "-m", "owsandbox.cli", "run", "--cwd", str(tmp_path),
                           "cd /tmp; X=kept", "echo $X $PWD"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "kept /tmp\n"


def _path_without_bubblewrap(folder: Path) -> str:
    """A PATH with bash and the usual tools but no bwrap: a machine where bubblewrap is not installed."""
    folder.mkdir()
    for name in ("bash", "sh", "env", "cat", "ls", "python3"):
        found = shutil.which(name)
        if found:
            os.symlink(found, folder / name)
    return str(folder)


def test_owsandbox_run_says_where_it_ran(tmp_path):
    done = subprocess.run([sys.executable, "-m", "owsandbox.cli", "run", "--json", "--cwd", str(tmp_path),
                           "--provider", "local", "echo hi"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["provider"] == "local" and json.loads(done.stdout)["output"] == "hi\n"
    assert done.stderr.startswith("owsandbox run: in local · no isolation"), done.stderr


def test_owsandbox_run_without_bubblewrap_refuses_to_run_unsandboxed_unless_asked(tmp_path):
    env = {**os.environ, "PATH": _path_without_bubblewrap(tmp_path / "bin")}
    env.pop("OWSANDBOX_PROVIDER", None)
    marker = tmp_path / "ran"
    refused = subprocess.run([sys.executable, "-m", "owsandbox.cli", "run", "--cwd", str(tmp_path),
                              f"echo > {marker}"], capture_output=True, text=True, timeout=60, env=env)
    assert refused.returncode == 2 and not marker.exists()
    assert "bubblewrap (bwrap) is not installed" in refused.stderr and "--provider local" in refused.stderr
    assert "apt-get install bubblewrap" in refused.stderr
    asked = subprocess.run([sys.executable, "-m", "owsandbox.cli", "run", "--cwd", str(tmp_path), "--provider",
                            "local", f"echo > {marker}"], capture_output=True, text=True, timeout=60, env=env)
    assert asked.returncode == 0 and marker.exists(), asked.stderr
    assert "no isolation" in asked.stderr


def test_the_provider_is_chosen_by_argument_or_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("OWSANDBOX_PROVIDER", "direct")
    ws = open_workspace(tmp_path)
    try:
        assert isinstance(ws, DirectWorkspace)
        assert ws.describe() == {"provider": "direct", "enforcement": "none", "cwd": str(tmp_path.resolve())}
        assert ws.executor.run("echo in-process")["output"] == "in-process\n"
    finally:
        ws.close()
    ws = open_workspace(tmp_path, provider="local")
    try:
        assert isinstance(ws, RunnerWorkspace)
        assert ws.describe()["provider"] == "local" and ws.describe()["enforcement"] == "none"
        assert ws.executor.run("echo via-daemon")["output"] == "via-daemon\n"
    finally:
        ws.close()


@pytest.mark.unit
def test_an_unknown_provider_names_the_known_ones(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="known providers: direct, auto, bwrap, container, exec, local, opensandbox"):
        open_workspace(tmp_path, provider="no-such-box")
    monkeypatch.setenv("OWSANDBOX_PROVIDER", "also-wrong")
    with pytest.raises(ValueError, match="'also-wrong'"):
        open_workspace(tmp_path)


def test_destroy_leaves_no_process_behind(tmp_path):
    ws = open_workspace(tmp_path, provider="local")
    ws.executor.run("sleep 300 & echo started")
    daemon_pid = ws.provider.daemon.pid
    shells = ws.client.call("shell.list", timeout=10)["shells"]
    ws.close()
    from owsandbox.box.shell.bash import session_members

    from .waiting import wait_until

    leaders = [daemon_pid] + [s["pid"] for s in shells]
    wait_until(lambda: not any(session_members(pid) for pid in leaders), 5,  # SIGKILL is delivered asynchronously
               f"the sessions of the daemon and its shells {leaders} to be empty")


def test_folders_of_daemons_that_are_gone_are_swept_away(tmp_path, zipapp, monkeypatch):
    """A kernel that was killed leaves its keyed folder behind; the next keyed sandbox tidies up."""
    import json
    import shutil
    import tempfile

    from owsandbox.host.providers.local import LocalProvider

    runtime = tempfile.mkdtemp(prefix="ows-rt-")  # short: a Unix socket path has at most 107 bytes
    monkeypatch.setenv("XDG_RUNTIME_DIR", runtime)
    first = LocalProvider(cwd=tmp_path, runner_path=zipapp, key=own_key("kernel-old"))
    first.create()
    old = Path(first.state_dir)
    first.release()  # as a killed kernel would: the daemon is left lingering
    daemon = json.loads((old / "daemon.json").read_text())["pid"]
    os.kill(daemon, 9)
    from .processes import wait_gone

    assert wait_gone([daemon]) == []  # SIGKILL is delivered asynchronously
    untouched = old.parent / "not-ours"
    untouched.mkdir()
    second = LocalProvider(cwd=tmp_path, runner_path=zipapp, key=own_key("kernel-new"))
    try:
        second.create()
        assert not old.exists() and untouched.exists()
    finally:
        second.destroy()
        shutil.rmtree(runtime, ignore_errors=True)


def test_the_relay_command_line_names_the_daemons_defaults():
    """cli.py repeats two defaults so a relay starts without importing the daemon's modules."""
    from owsandbox import protocol
    from owsandbox.box import cli
    from owsandbox.box.shell import bash as shells

    assert cli.DEFAULT_MAX_FRAME_BYTES == protocol.DEFAULT_MAX_FRAME_BYTES
    assert cli.DEFAULT_OUTPUT_LIMIT == shells.DEFAULT_OUTPUT_LIMIT
    done = subprocess.run([sys.executable, "-S", "-X", "importtime", "-m", "owsandbox.box.cli", "--help"],
                          capture_output=True, text=True, timeout=60, cwd=str(Path(__file__).resolve().parents[1]))
    assert "owsandbox.box.shell.bash" not in done.stderr  # `attach` does not load the shells
