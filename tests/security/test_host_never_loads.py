"""The host never runs or loads by itself what the box wrote.

Each test is an attack that plants what this machine would run on its own the next time the user does
something ordinary — starts `python3`, a login shell, a Jupyter server, `git commit`, a kernel — and
then does that ordinary thing on the host, as the sandbox's owner, and checks that nothing planted
ran. Run as root and as a plain user made with `useradd`.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from ..plain_python import as_user
from ..private_tmp import private_tmp

PYTHON = f"python{sys.version_info.major}.{sys.version_info.minor}"


def on_host(who: str, owner: pwd.struct_passwd, home: Path, argv: list[str], cwd: Path | str = "/") -> str:
    """`argv` run on this machine as the sandbox's owner, with that home: what the user does next."""
    env = {"HOME": str(home), "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "USER": owner.pw_name}
    command = as_user(owner.pw_name, argv, env, clear_env=True) if who == "user" and os.getuid() == 0 else argv
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=cwd,
                          env=env if command is argv else None)
    return done.stdout + done.stderr


def chown_tree(path: Path, owner: pwd.struct_passwd) -> None:
    for root, folders, files in os.walk(path):
        for name in [*folders, *files, "."]:
            os.lchown(os.path.join(root, name), owner.pw_uid, owner.pw_gid)


def test_a_home_workspace_cannot_plant_start_up_code(attacker_factory, home: Path, marker: Path, who: str, owner):
    """The README's JupyterHub layout: the workspace is the home. A fresh home made by useradd has no
    ~/.local, ~/.jupyter or ~/.ipython yet: making them is as much an attack as writing into them."""
    (home / "notes.txt").write_text("mine\n")
    os.chown(home / "notes.txt", owner.pw_uid, owner.pw_gid)
    attacker = attacker_factory()
    attacker.start(home)
    plant = f"import os; open('{marker}', 'w').write('ran')"
    attempts = {
        "user site .pth": f"mkdir -p ~/.local/lib/{PYTHON}/site-packages && "
                          f"echo \"{plant}\" > ~/.local/lib/{PYTHON}/site-packages/zz.pth",
        "jupyter config": f"mkdir -p ~/.jupyter && echo \"{plant}\" > ~/.jupyter/jupyter_server_config.py",
        "ipython start-up": f"mkdir -p ~/.ipython/profile_default/startup && "
                            f"echo \"{plant}\" > ~/.ipython/profile_default/startup/00.py",
        "bash aliases": f"echo 'touch {marker}' > ~/.bash_aliases",
        "bash profile": f"echo 'touch {marker}' > ~/.bash_profile",
        "bashrc": f"echo 'touch {marker}' >> ~/.bashrc",
        "profile": f"echo 'touch {marker}' >> ~/.profile",
        "local bin": f"mkdir -p ~/.local/bin && printf '#!/bin/sh\\ntouch {marker}\\n' > ~/.local/bin/ls && "
                     "chmod +x ~/.local/bin/ls",
        "home bin": f"mkdir -p ~/bin && printf '#!/bin/sh\\ntouch {marker}\\n' > ~/bin/ls && chmod +x ~/bin/ls",
        "kernelspec": "mkdir -p ~/.local/share/jupyter/kernels/evil && echo '{}' > "
                      "~/.local/share/jupyter/kernels/evil/kernel.json",
    }
    for what, command in attempts.items():
        done = attacker.run(command)
        assert done["exit_code"] != 0, (what, done)
        assert "Read-only file system" in done["output"] or "Permission denied" in done["output"], (what, done)
    for name in (".local", ".jupyter", ".ipython", ".bash_aliases", ".bash_profile", "bin"):
        assert not (home / name).exists(), name
    assert (home / ".bashrc").read_text() == "# the user's own\n"
    # What the user does next on this machine: a login shell (which reads .profile, .bashrc and what
    # they source, and puts ~/bin and ~/.local/bin first on PATH), python3 (site, .pth files), ls.
    on_host(who, owner, home, ["bash", "-l", "-i", "-c", "ls >/dev/null; python3 -c pass"])
    assert not marker.exists(), "code the box planted ran on the host"
    # The workspace is still the user's data: what exists in it stays writable.
    assert attacker.run("echo more >> ~/notes.txt && echo ok > ~/project/made-in-box")["exit_code"] == 0
    assert (home / "notes.txt").read_text() == "mine\nmore\n"
    described = attacker.step(describe=True)
    assert described["mounts"][f"{home}/.ssh"].startswith("hidden")
    assert "nothing new can be made" in described["mounts"][str(home)]
    assert "home dot entries hidden" in described["workspace guard"]


def test_the_home_shows_what_the_user_lets_it(attacker_factory, home: Path, owner):
    (home / ".course").write_text("lesson\n")
    os.chown(home / ".course", owner.pw_uid, owner.pw_gid)
    attacker = attacker_factory(OWSANDBOX_HOME_VISIBLE=".course")
    attacker.start(home)
    assert attacker.run("cat ~/.course")["output"] == "lesson\n"
    assert attacker.run("cat ~/.ssh/id_ed25519")["exit_code"] != 0


def test_an_environment_in_the_workspace_is_read_only(attacker_factory, project: Path, home: Path, marker: Path,
                                                      who: str, owner):
    """The quick start's layout: the kernel's own .venv in the notebook's folder."""
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip",
                    str(project / ".venv")], check=True, timeout=60)
    chown_tree(project, owner)
    site = next((project / ".venv" / "lib").glob("python3*")) / "site-packages"
    attacker = attacker_factory()
    attacker.start(project)
    plant = f"import os; open('{marker}', 'w').write('ran')"
    for command in (f"echo \"{plant}\" > {site}/zz.pth",
                    "mkdir -p .venv/share/jupyter/kernels/evil",
                    f"printf '#!/bin/sh\\ntouch {marker}\\n' > .venv/bin/jupyter",
                    "echo 'include-system-site-packages = true' >> .venv/pyvenv.cfg"):
        done = attacker.run(command)
        assert done["exit_code"] != 0 and "Read-only file system" in done["output"], (command, done)
    on_host(who, owner, home, [str(project / ".venv" / "bin" / "python"), "-c", "pass"])
    assert not marker.exists(), "a .pth the box planted ran in the host's python"
    assert "a Python environment" in attacker.step(describe=True)["mounts"][str(project / ".venv")]


def test_an_environment_the_box_made_stays_writable(attacker_factory, project: Path, owner):
    """`python3 -m venv` in a cell, then `pip install` into it in a later session: the host noted, when
    the first sandbox ended, that the box made it. One made on the host meanwhile is not the box's."""
    first = attacker_factory()
    first.start(project)
    made = first.run("python3 -m venv --without-pip boxenv && touch boxenv/lib/one && echo made")
    assert made["output"].strip().endswith("made"), made
    first.step(close=True)
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(project / "hostenv")], check=True,
                   timeout=60)
    chown_tree(project / "hostenv", owner)
    second = attacker_factory()
    second.start(project)
    assert second.run("touch boxenv/lib/two")["exit_code"] == 0
    assert second.run("touch hostenv/lib/evil")["exit_code"] != 0
    guard = second.step(describe=True)["workspace guard"]
    assert "boxenv" in guard["environments the box made (writable)"]


def test_a_path_the_user_names_stays_writable(attacker_factory, project: Path, owner):
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(project / ".venv")], check=True,
                   timeout=60)
    chown_tree(project, owner)
    attacker = attacker_factory(OWSANDBOX_WRITABLE=".venv")
    attacker.start(project)
    assert attacker.run("touch .venv/lib/mine")["exit_code"] == 0


def test_git_config_and_hooks_are_read_only_but_commits_work(attacker_factory, project: Path, home: Path,
                                                             marker: Path, who: str, owner):
    repo = project / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "config", "core.hooksPath", ".githooks"], check=True)
    (repo / ".githooks").mkdir()
    (repo / ".envrc").write_text("export A=1\n")
    (repo / ".vscode").mkdir()
    (repo / ".idea").mkdir()
    chown_tree(project, owner)
    attacker = attacker_factory()
    attacker.start(project)
    hook = f"printf '#!/bin/sh\\ntouch {marker}\\n' > HOOK && chmod +x HOOK"
    for command in (hook.replace("HOOK", "repo/.git/hooks/pre-commit"),
                    hook.replace("HOOK", "repo/.githooks/pre-commit"),
                    f"git -C repo config core.fsmonitor 'touch {marker}'",
                    f"echo 'touch {marker}' >> repo/.envrc",
                    "echo '{}' > repo/.vscode/tasks.json",
                    "echo '<project/>' > repo/.idea/workspace.xml",
                    "echo 'a.txt filter=evil' > repo/.git/info/attributes"):
        done = attacker.run(command)
        assert done["exit_code"] != 0, (command, done)
    committed = attacker.run("cd repo && echo hi > a.txt && git add a.txt && git -c user.name=a -c user.email=a@b "
                             "commit -q -m first && git log --oneline | wc -l")
    assert committed["exit_code"] == 0 and committed["output"].strip().endswith("1"), committed
    on_host(who, owner, home, ["git", "-c", "user.name=a", "-c", "user.email=a@b", "-c", "safe.directory=*",
                               "commit", "-q", "--allow-empty", "-m", "second"], cwd=repo)
    assert not marker.exists(), "a hook or config the box planted ran in the host's git"


def test_a_notebook_in_tmp_itself_works_and_hides_the_hosts_sockets(attacker_factory, readable_copy: Path,
                                                                     home: Path, who: str, owner):
    """A notebook opened in /tmp: the workspace is the host's /tmp, where tmux, ssh-agent and X keep
    their sockets, and where this user's private state folder is (a /tmp of its own, as root: see
    tests/private_tmp.py)."""
    folder = Path(tempfile.mkdtemp(prefix="owsbx-service-", dir="/tmp"))
    os.chmod(folder, 0o755)
    service = socket.socket(socket.AF_UNIX)
    service.bind(str(folder / "agent.sock"))
    service.listen()
    os.chown(folder, owner.pw_uid, owner.pw_gid)
    os.chown(folder / "agent.sock", owner.pw_uid, owner.pw_gid)
    try:
        attacker = attacker_factory(outer=private_tmp(readable_copy, home, folder))
        started = attacker.start("/tmp")
        assert started["started"]
        state = attacker.step(state=True)["state_dir"]
        assert not state.startswith("/tmp/"), state
        probe = attacker.run(f"python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); "
                             f"s.connect('{folder}/agent.sock'); print('REACHED')\"")
        assert "REACHED" not in probe["output"], probe
        assert "REACHED" in attacker.step(host=f"python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); "
                                               f"s.connect('{folder}/agent.sock'); print('REACHED')\"")["output"]
        if os.getuid() == 0:  # the /tmp of its own holds only what was kept: no other test's repositories
            shown = set(attacker.step(host="ls -A /tmp")["output"].split())
            assert {readable_copy.name, home.name, folder.name} <= shown, shown
            assert not any(name.startswith("pytest-of-") for name in shown), shown
        private = f"/tmp/owsandbox-{owner.pw_uid}"
        if attacker.step(host=f"test -d {private}")["exit_code"] == 0:  # the host's side, in its /tmp
            assert attacker.run(f"ls -A {private}")["output"].strip() == "", "the private state folder shows"
            assert attacker.run(f"touch {private}/runners/x")["exit_code"] != 0
        assert attacker.run("echo hi > /tmp/owsbx-from-box-$$ && echo ok && rm /tmp/owsbx-from-box-$$")[
            "output"].strip() == "ok"
        assert "sockets hidden" in attacker.step(describe=True)["workspace guard"]
    finally:
        service.close()
        shutil.rmtree(folder, ignore_errors=True)


def test_a_program_the_box_planted_on_the_kernels_path_is_never_run_by_the_host(attacker_factory, project: Path,
                                                                                marker: Path, owner):
    """A user activated an environment the box made (it stays writable, on purpose), so its `bin/` is first
    on the kernel's PATH. The box plants `bwrap`, `git`, `ip` and `nsenter` there, each leaving a mark and
    then doing the real program's work; the next sandbox's start (bubblewrap looked up, a repository's
    hooksPath read) must run none of them: this machine's programs are never looked up in the workspace."""
    planted_bin = project / "boxenv" / "bin"
    first = attacker_factory()
    first.start(project)
    plant = "; ".join(
        f"printf '#!/bin/sh\\necho {name} >> {marker}\\nexec /usr/bin/{name} \"$@\"\\n' > boxenv/bin/{name}; "
        f"chmod +x boxenv/bin/{name}" for name in ("bwrap", "git", "ip", "nsenter"))
    made = first.run(f"python3 -m venv --without-pip boxenv && {plant} && mkdir -p repo/.git && "
                     "printf '[core]\\n\\thooksPath = hooks\\n' > repo/.git/config && echo planted")
    assert made["output"].strip().endswith("planted"), made
    first.step(close=True)
    activated = {"PATH": f"{planted_bin}:/usr/local/bin:/usr/bin:/bin", "VIRTUAL_ENV": str(project / "boxenv")}
    second = attacker_factory(**activated)
    second.start(project)
    assert second.run("echo in-the-box")["output"] == "in-the-box\n"
    assert not marker.exists(), f"the host ran what the box planted: {marker.read_text()}"
    described = second.step(describe=True)
    assert "boxenv" in described["workspace guard"]["environments the box made (writable)"]
