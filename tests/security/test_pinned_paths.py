"""A protected path is protected whole: the box cannot rename, remove or replace it, nor any folder above
it up to the workspace's top, and the host never binds a folder of its own through a link.

Each test is the attack: the box renames what is above a protected path (or `.git` itself) and plants
a new one where the host looks, or uses a link at the top of a home, or a workspace on the kernel's
Python path; then the host does the ordinary thing (`git status`, runs the environment's python, starts
python) and nothing planted runs. Run as root and as a plain user made with `useradd`.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from .test_host_never_loads import chown_tree, on_host

PYTHON = f"python{sys.version_info.major}.{sys.version_info.minor}"
BUSY = "Device or resource busy"
PLANT_SH = "printf '#!/bin/sh\\ntouch {marker}\\n' > {path} && chmod +x {path}"


@pytest.fixture
def bare_home(owner: pwd.struct_passwd) -> Iterator[Path]:
    """A home with nothing in it, for the host's git: no global config of the user's decides the result."""
    folder = Path(tempfile.mkdtemp(prefix="owsbx-githome-"))
    os.chown(folder, owner.pw_uid, owner.pw_gid)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def venv(path: Path, owner: pwd.struct_passwd, *options: str) -> Path:
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", *options, str(path)], check=True, timeout=60)
    return next((path / "lib").glob("python3*")) / "site-packages"


def test_git_cannot_be_renamed_and_replaced_by_one_whose_fsmonitor_the_host_runs(
        attacker_factory, project: Path, bare_home: Path, marker: Path, who: str, owner):
    repo = project / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "a.txt").write_text("a\n")
    subprocess.run(["git", "-C", str(repo), "add", "a.txt"], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-q", "-m", "one"],
                   check=True)
    chown_tree(project, owner)
    attacker = attacker_factory()
    attacker.start(project)
    attack = attacker.run("(cd repo && mv .git .git-old; mkdir -p .git && cp -r .git-old/HEAD .git-old/objects "
                          ".git-old/refs .git-old/index .git/; printf '[core]\\n\\tfsmonitor = \"touch "
                          f"{marker}; false\"\\n' > .git/config)")
    on_host(who, owner, bare_home, ["env", "GIT_CONFIG_NOSYSTEM=1", "git", "status", "--short"], cwd=repo)
    assert not marker.exists(), "the host's git status ran the fsmonitor the box named"
    assert attack["exit_code"] != 0 and BUSY in attack["output"], attack
    assert not (repo / ".git-old").exists()
    assert BUSY in attacker.run("rmdir repo/.git")["output"]
    assert BUSY in attacker.run("mv repo repo-old")["output"]  # nor the folder above it
    # the repository is still the box's to work in
    committed = attacker.run("(cd repo && echo b > b.txt && git add b.txt && git -c user.name=a -c user.email=a@b "
                             "commit -q -m two && git log --oneline | wc -l)")
    assert committed["exit_code"] == 0 and committed["output"].strip().endswith("2"), committed
    described = attacker.step(describe=True)
    assert described["mounts"][str(repo / ".git")].startswith("pinned"), described["mounts"]
    assert "repo/.git" in described["workspace guard"]["pinned"]


def test_an_environment_two_levels_down_cannot_be_swapped_by_renaming_its_parents(
        attacker_factory, project: Path, home: Path, marker: Path, who: str, owner):
    environment = project / "src" / "proj" / ".venv"
    environment.parent.mkdir(parents=True)
    venv(environment, owner)
    chown_tree(project, owner)
    python = environment / "bin" / "python"
    real = os.path.realpath(python)
    attacker = attacker_factory()
    attacker.start(project)
    attack = attacker.run("mv src/proj src/proj-old; mkdir -p src/proj/.venv/bin && "
                          + PLANT_SH.format(marker=marker, path="src/proj/.venv/bin/python"))
    on_host(who, owner, home, [str(python), "-c", "pass"])
    assert not marker.exists(), "the box's python ran in place of the environment's"
    assert attack["exit_code"] != 0 and BUSY in attack["output"], attack
    assert os.path.realpath(python) == real
    for folder in ("src", "src/proj"):
        done = attacker.run(f"mv {folder} {folder}-old")
        assert done["exit_code"] != 0 and BUSY in done["output"], (folder, done)
        assert BUSY in attacker.run(f"mkdir other && mv -T other {folder}; rmdir other")["output"]
    # what is not protected stays the box's to change
    assert attacker.run("mkdir -p src/proj/code && mv src/proj/code src/proj/code2 && echo ok")["output"] == "ok\n"
    mounts = attacker.step(describe=True)["mounts"]
    assert mounts[str(project / "src")].startswith("pinned") and mounts[str(project / "src/proj")].startswith("pinned")


@pytest.fixture
def kernel_environment(project: Path, owner: pwd.struct_passwd) -> Path:
    """The quick start's layout, one level down: the kernel runs from an environment in the workspace
    (made with the system's site-packages, where this package's dependencies are)."""
    environment = project / "kernel" / ".venv"
    environment.parent.mkdir()
    venv(environment, owner, "--system-site-packages")
    chown_tree(project, owner)
    return environment


def test_the_kernels_own_environment_cannot_be_swapped_from_above(
        attacker_factory, project: Path, home: Path, kernel_environment: Path, marker: Path, who: str,
        owner):
    python = kernel_environment / "bin" / "python"
    attacker = attacker_factory(python=str(python))
    attacker.start(project)
    attack = attacker.run("mv kernel kernel-old; mkdir -p kernel/.venv/bin && "
                          + PLANT_SH.format(marker=marker, path="kernel/.venv/bin/python"))
    assert attack["exit_code"] != 0 and BUSY in attack["output"], attack
    on_host(who, owner, home, [str(python), "-c", "pass"])  # the next kernel start
    assert not marker.exists(), "the next kernel would run the box's python"
    mounts = attacker.step(describe=True)["mounts"]
    assert mounts[str(project / "kernel")].startswith("pinned")
    assert "the kernel's Python environment" in mounts[str(kernel_environment)]


def test_writable_never_opens_the_kernels_own_environment(
        attacker_factory, project: Path, home: Path, kernel_environment: Path, marker: Path, who: str,
        owner):
    site = next((kernel_environment / "lib").glob("python3*")) / "site-packages"
    python = kernel_environment / "bin" / "python"
    attacker = attacker_factory(python=str(python), OWSANDBOX_WRITABLE="kernel/.venv")
    attacker.start(project)
    done = attacker.run(f"echo \"import os; open('{marker}', 'w')\" > {site}/zz.pth")
    assert done["exit_code"] != 0 and "Read-only file system" in done["output"], done
    on_host(who, owner, home, [str(python), "-c", "pass"])
    assert not marker.exists()
    guard = attacker.step(describe=True)["workspace guard"]
    assert "kernel/.venv" in guard["not opened (OWSANDBOX_WRITABLE)"], guard


def test_a_link_at_the_top_of_a_home_never_binds_a_folder_of_this_machine(
        attacker_factory, home: Path, marker: Path, who: str, owner):
    """`~/scratch -> ../../tmp`: the host's /tmp (and the runners this machine runs in it) must not be
    bound over the box's own. A dot link into the workspace hides its target, which the host loads."""
    os.symlink(os.path.relpath("/tmp", home), home / "scratch")
    (home / "dotfiles").mkdir()
    (home / "dotfiles" / "bashrc").write_text("# the user's own\n")
    os.symlink("dotfiles/bashrc", home / ".bash_aliases")
    chown_tree(home, owner)
    assert os.path.realpath(home / "scratch") == "/tmp"
    attacker = attacker_factory()
    attacker.start(home)
    attacker.run(f"echo planted > ~/scratch/{marker.name}")
    assert not marker.exists(), "the host's /tmp was bound into the box"
    listed = attacker.run("ls -A ~/scratch/")
    assert f"owsandbox-{owner.pw_uid}" not in listed["output"], listed
    done = attacker.run(f"echo 'touch {marker}' >> ~/dotfiles/bashrc")
    assert done["exit_code"] != 0, done
    assert (home / "dotfiles" / "bashrc").read_text() == "# the user's own\n"
    links = attacker.step(describe=True)["workspace guard"]["links at the top"]
    assert "scratch: a link out of the workspace" in links and ".bash_aliases" in links, links


def test_a_link_at_the_top_of_a_home_to_nothing_does_not_stop_the_start(attacker_factory, home: Path, owner):
    os.symlink("../nowhere/at/all", home / "gone")
    os.symlink("/nowhere/either", home / ".gone")
    chown_tree(home, owner)
    attacker = attacker_factory()
    attacker.start(home)
    assert attacker.run("echo hi")["output"] == "hi\n"
    links = attacker.step(describe=True)["workspace guard"]["links at the top"]
    assert "gone: a link to ../nowhere/at/all, which is missing" in links, links
    assert attacker.run("touch ~/gone")["exit_code"] != 0  # the top is read-only: it is not made either


def test_a_workspace_on_the_kernels_python_path_takes_no_new_module(
        attacker_factory, project: Path, home: Path, readable_copy: Path, marker: Path, who: str,
        owner):
    """An editable install: the notebook's folder is on the kernel's Python path. A `sitecustomize.py`
    planted there would run in every later Python of that environment."""
    (project / "notes.txt").write_text("mine\n")
    (project / "pkg").mkdir()
    (project / "usercustomize.py").write_text("# the user's own\n")
    chown_tree(project, owner)
    attacker = attacker_factory(PYTHONPATH=f"{readable_copy}:{project}")
    attacker.start(project)
    plant = f"import os; open('{marker}', 'w').write('ran')"
    for command in (f"echo \"{plant}\" > sitecustomize.py", f"echo \"{plant}\" > usercustomize.py",
                    f"echo \"{plant}\" > json2.py", "mkdir newpkg"):
        done = attacker.run(command)
        assert done["exit_code"] != 0 and "Read-only file system" in done["output"], (command, done)
    on_host(who, owner, home, ["env", f"PYTHONPATH={project}", "python3", "-c", "pass"])
    assert not marker.exists(), "a module the box planted ran in the host's python"
    # what is there stays the box's to change
    assert attacker.run("echo more >> notes.txt && touch pkg/mod.py && echo ok")["output"] == "ok\n"
    assert (project / "notes.txt").read_text() == "mine\nmore\n"
    guard = attacker.step(describe=True)["workspace guard"]
    assert "on the kernel's Python path" in guard["top of the workspace"], guard
