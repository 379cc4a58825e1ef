"""The host never runs what a box-made git configuration names.

Each test is the attack: a cell makes (or redirects) a git folder whose configuration or hooks name a
program, the cell ends (or the box does), and then the user does the ordinary thing on this machine, as
the sandbox's owner: `git status`, `git diff`, `git log` through a pager on a terminal, `git commit`, with
no system or global configuration and no GIT_PAGER (PAGER=cat only stands for the default `less`: git
prefers `core.pager` to it). The program the box named must never run; what the box's repository needs
(its remote, its author, its commits) must still work. Run as root and as a plain user made with
`useradd`.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import time
from pathlib import Path

import pytest

from ..waiting import patience, shell_waits_for, wait_until
from .conftest import plain_user
from .test_host_never_loads import chown_tree, on_host

QUARANTINE = "config.owsandbox-quarantine"


def host_git(who: str, owner, home: Path, repo: Path) -> dict[str, str]:
    """The user's next git commands in `repo`, on this machine: each command's exit and output."""
    script = """
        export HOME="$(mktemp -d)" GIT_CONFIG_NOSYSTEM=1 PAGER=cat TERM=xterm
        unset GIT_PAGER GIT_DIR GIT_WORK_TREE
        cd "$1" || exit 99
        say() { printf '\\n@@owsbx %s %s\\n' "$1" "$2"; }
        git status; say status $?
        git diff; say diff $?
        script -qec 'git --paginate log -1 --format=%an' /dev/null </dev/null; say log $?
        git commit -q --allow-empty -m 'from the host'; say commit $?
        git config user.name; say name $?
        rm -rf "$HOME"
    """
    output = on_host(who, owner, home, ["timeout", "60", "bash", "-c", script, "host-git", str(repo)])
    results: dict[str, str] = {"output": output}
    for line in output.splitlines():
        if line.startswith("@@owsbx "):
            _, name, code = line.split()
            results[name] = code
    return results


def assert_inert(who: str, owner, home: Path, repo: Path, marker: Path, bare: bool = False
                 ) -> dict[str, str]:
    done = host_git(who, owner, home, repo)
    assert not marker.exists(), f"the host's git ran a program the box named in {repo}: {done['output']}"
    if not bare:  # a bare repository has no work tree: status, diff and commit refuse to run
        assert done.get("status") == "0", done
    return done


def test_a_repository_the_box_makes_names_no_program_the_host_runs(attacker_factory, project: Path,
                                                                   home: Path, marker: Path, who: str, owner):
    """`git init notes && git -C notes config core.fsmonitor …`, and every other key that names a program,
    hooks, includes and a textconv driver; the allowed keys stay, and the user is told once."""
    attacker = attacker_factory()
    attacker.start(project)
    touch = f"touch {marker}"
    made = attacker.run(
        "git init -q notes && cd notes && git config user.name Box && git config user.email box@example.com && "
        "git remote add origin https://example.com/notes.git && "
        f"echo hi > a.txt && git add a.txt && git commit -qm one && "
        f"git config core.fsmonitor '{touch}; false' && git config core.pager '{touch}; cat' && "
        f"git config core.editor '{touch}' && git config alias.st '!{touch}' && "
        f"git config core.sshCommand '{touch}' && git config credential.helper '!{touch}' && "
        "git config core.hooksPath .githooks && git config include.path ../evil.cfg && "
        "git config includeIf.gitdir:/.path ../evil.cfg && "
        f"printf '[core]\\n\\tfsmonitor = {touch}; false\\n' > ../evil.cfg && "
        "git remote add evil 'ext::sh -c touch% /tmp/x' && "
        f"printf '#!/bin/sh\\n{touch}\\n' > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit && "
        "cp .git/hooks/pre-commit .git/hooks/post-commit && mkdir .githooks && cp .git/hooks/pre-commit .githooks/ && "
        "echo '*.txt diff=evil filter=evil' > .gitattributes && "
        f"git config diff.evil.textconv 'sh -c \"{touch}; cat \\$1\" -' && "
        f"git config filter.evil.clean 'sh -c \"{touch}; cat\"' && echo more >> a.txt")
    assert made["exit_code"] == 0, made
    said = attacker.step(after_cell=True)["note"]
    repo = project / "notes"
    done = assert_inert(who, owner, home, repo, marker)
    assert said and "notes/.git (core.fsmonitor" in said and "more" in said, said
    assert attacker.step(after_cell=True)["note"] is None  # said once: nothing more to move
    assert done.get("commit") == "0" and done.get("log") == "0", done  # the author kept: commits work
    assert "Box" in done["output"]
    moved = (repo / ".git" / QUARANTINE).read_text()
    for key in ("fsmonitor", "pager", "editor", "sshcommand", "hookspath", "[alias]", "[credential]", "[include]",
                "[includeif", "textconv", "[filter", "ext::"):
        assert key in moved, (key, moved)
    kept = subprocess.run(["git", "config", "--file", str(repo / ".git" / "config"), "--list"], capture_output=True,
                          text=True, check=True).stdout
    assert "remote.origin.url=https://example.com/notes.git" in kept and "user.email=box@example.com" in kept
    assert "ext::" not in kept and "fsmonitor" not in kept
    hooks = sorted(p.name for p in (repo / ".git" / "owsandbox-quarantine" / "hooks").iterdir())
    assert hooks == ["post-commit", "pre-commit"]
    attacker.close()
    assert not marker.exists()


def test_a_repository_behind_a_folder_the_box_shuts_is_still_checked(attacker_factory, project: Path,
                                                                     home: Path, marker: Path, who: str, owner):
    """The box makes a repository, then takes the search bit off the folder holding it (`chmod 000`): it
    owns that folder, so it could open it again, and so can the user (root enters it as it is)."""
    attacker = attacker_factory()
    attacker.start(project)
    made = attacker.run(f"mkdir shut && git init -q shut/notes && "
                        f"git -C shut/notes config core.fsmonitor 'touch {marker}; false' && chmod 000 shut")
    assert made["exit_code"] == 0, made
    said = attacker.step(after_cell=True)["note"]
    assert said and "shut/notes/.git (core.fsmonitor)" in said, said
    os.chmod(project / "shut", 0o755)  # the user opens it, and runs git there
    assert_inert(who, owner, home, project / "shut" / "notes", marker)


def test_another_users_repository_the_box_cannot_enter_is_left_as_it_is(attacker_factory, project: Path,
                                                                        who: str, owner):
    """A notebook in a shared folder (`/tmp`, say) whose box cannot enter another user's private folder there:
    nothing in it can be the box's, so a config written there while the box runs is that user's, untouched."""
    if os.getuid() != 0:
        pytest.skip("needs a folder of another user: run as root (CI)")
    other = pwd.getpwuid(0) if owner.pw_uid != 0 else plain_user()
    attacker = attacker_factory()
    attacker.start(project)
    private = project / "theirs"
    private.mkdir()
    subprocess.run(["git", "init", "-q", str(private / "repo")], check=True, timeout=60)
    subprocess.run(["git", "-C", str(private / "repo"), "config", "core.hooksPath", ".githooks"], check=True,
                   timeout=60)
    chown_tree(private, other)
    os.chmod(private, 0o700)
    config = (private / "repo" / ".git" / "config").read_text()
    assert attacker.run("ls theirs")["exit_code"] != 0  # the box cannot enter it
    assert attacker.step(after_cell=True)["note"] is None
    attacker.close()
    assert (private / "repo" / ".git" / "config").read_text() == config
    assert not (private / "repo" / ".git" / QUARANTINE).exists()


def _user_repository(who: str, owner, home: Path, repo: Path, *config: str) -> None:
    """A repository of the user's own, with one commit, made before the sandbox starts."""
    commands = [f"git init -q {repo}", f"git -C {repo} config user.name Me", f"git -C {repo} config user.email me@x",
                *(f"git -C {repo} config {setting}" for setting in config),
                f"git -C {repo} commit -q --allow-empty -m mine"]
    on_host(who, owner, home, ["bash", "-ec", " && ".join(commands)])
    time.sleep(0.2)  # older than the box's start, as the user's own files are


CASES = {
    # (an existing repository's .git replaced by renaming it: refused, as .git is pinned whole; see
    # tests/security/test_pinned_paths.py)
    # a .git file pointing at a git folder the box made where the walk does not go
    "gitfile": ("mkdir -p node_modules/x other && git init -q --bare node_modules/x/gd && "
                "git --git-dir=node_modules/x/gd config core.bare false && "
                "git --git-dir=node_modules/x/gd config core.fsmonitor 'TOUCH; false' && "
                "echo 'gitdir: ../node_modules/x/gd' > other/.git", "other"),
    # a commondir added into an existing repository's .git: git reads the config there
    "commondir": ("mkdir -p node_modules && git init -q --bare node_modules/c && cp -r proj/.git/objects/. "
                  "node_modules/c/objects/ && cp -r proj/.git/refs/. node_modules/c/refs/ && "
                  "git --git-dir=node_modules/c config core.bare false && "
                  "git --git-dir=node_modules/c config core.fsmonitor 'TOUCH; false' && "
                  "echo ../../node_modules/c > proj/.git/commondir", "proj"),
    # config.worktree beside a read-only config that enables it
    "config.worktree": ("printf '[core]\\n\\tfsmonitor = TOUCH; false\\n' > wtc/.git/config.worktree", "wtc"),
    # a bare repository's layout in any folder: git finds it walking up, and `git log` pages
    "bare layout": ("mkdir -p data/sub && cd data && git init -q --bare . && "
                    "git config core.pager 'TOUCH; cat' && "
                    "git config core.fsmonitor 'TOUCH; false' && git config user.name Box && "
                    "git config user.email b@x && git commit-tree -m x 4b825dc642cb6eb9a060e54bf8d69288fbee4904 "
                    "> c && git update-ref refs/heads/master $(cat c)", "data/sub"),
    # hooks in a linked worktree's git folder (git runs the common folder's hooks, config from commondir)
    "worktree commondir": ("git -C proj worktree add -q ../wt 2>&1 && mkdir -p node_modules && "
                           "git init -q --bare node_modules/w && git --git-dir=node_modules/w config core.bare false "
                           "&& git --git-dir=node_modules/w config core.fsmonitor 'TOUCH; false' && "
                           "cp -r proj/.git/objects/. node_modules/w/objects/ && "
                           "cp -r proj/.git/refs/. node_modules/w/refs/ && "
                           "echo ../../../../node_modules/w > proj/.git/worktrees/wt/commondir", "wt"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_redirected_or_replaced_git_folder_names_no_program_the_host_runs(
        attacker_factory, project: Path, home: Path, marker: Path, who: str, owner, case: str):
    command, probe = CASES[case]
    _user_repository(who, owner, home, project / "proj")
    _user_repository(who, owner, home, project / "wtc", "extensions.worktreeConfig true")
    attacker = attacker_factory()
    attacker.start(project)
    made = attacker.run(command.replace("TOUCH", f"touch {marker}"))
    assert made["exit_code"] == 0, made
    said = attacker.step(after_cell=True)["note"]
    assert_inert(who, owner, home, project / probe, marker, bare=case == "bare layout")
    assert said and "core.fsmonitor" in said, said
    # the user's own repositories keep their own config
    own = on_host(who, owner, home, ["git", "config", "--file", str(project / "wtc" / ".git" / "config"), "--list"])
    assert "extensions.worktreeconfig=true" in own and "user.name=Me" in own, own


def test_what_the_box_writes_after_the_cell_is_moved_at_the_boxs_end(attacker_factory, project: Path,
                                                                     home: Path, marker: Path, who: str, owner):
    """A program the cell leaves behind writes the config after the cell's check: the box's end catches it."""
    attacker = attacker_factory()
    attacker.start(project)
    later = (f"({shell_waits_for('go')}; git init -q late && "
             f"git -C late config core.fsmonitor 'touch {marker}; false') >/dev/null 2>&1 &")
    assert attacker.run(later)["exit_code"] == 0
    said = attacker.step(after_cell=True)["note"]
    (project / "go").touch()  # only now, after the cell's check, does the program write
    config = project / "late" / ".git" / "config"
    wait_until(lambda: config.exists() and "fsmonitor" in config.read_text(), patience(10),
               "the program left behind to write the config")
    attacker.close()
    assert_inert(who, owner, home, project / "late", marker)
    assert said is None  # the cell's check came before the write
    assert "fsmonitor" in (project / "late" / ".git" / QUARANTINE).read_text()


def test_a_box_whose_kernel_was_killed_is_checked_at_the_next_start(attacker_factory, project: Path,
                                                                    home: Path, marker: Path, who: str, owner):
    """The kernel dies (SIGKILL) before any check: the next sandbox on the workspace checks what the old
    one could have written before anything runs, and says so at its first cell."""
    attacker = attacker_factory()
    attacker.start(project)
    assert attacker.run(f"git init -q notes && git -C notes config core.fsmonitor 'touch {marker}; false'"
                        )["exit_code"] == 0
    attacker.kill()
    time.sleep(0.5)
    again = attacker_factory()
    again.start(project)
    assert_inert(who, owner, home, project / "notes", marker)
    said = again.step(after_cell=True)["note"]
    assert said and "notes/.git (core.fsmonitor)" in said, said


def test_the_kernel_moves_them_at_the_cells_end_and_says_so_once(default_kernel, tmp_path: Path, marker: Path):
    """Through a real kernel on the default sandbox: the cell's output ends with one dimmed note, the next
    cell's has none, and the host's git in the box's repository runs nothing it named."""
    made = default_kernel.run(f"git init -q notes && git -C notes config core.fsmonitor 'touch {marker}; false' && "
                              f"printf '#!/bin/sh\\ntouch {marker}\\n' > notes/.git/hooks/pre-commit && "
                              "chmod +x notes/.git/hooks/pre-commit && echo made")
    assert made.status == "ok" and made.text() == "made\n", made.outputs
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GIT_CONFIG_NOSYSTEM": "1"}
    subprocess.run(["git", "-C", str(tmp_path / "notes"), "status"], capture_output=True, timeout=60, env=env)
    done = subprocess.run(["git", "-C", str(tmp_path / "notes"), "-c", "user.name=a", "-c", "user.email=a@b",
                           "commit", "-q", "--allow-empty", "-m", "x"], capture_output=True, text=True, timeout=60,
                          env=env)
    assert not marker.exists(), "the host's git ran what the cell named"
    assert done.returncode == 0, done.stderr
    said = [line for line in made.notes().splitlines() if line.startswith("[git:")]
    assert len(said) == 1 and "notes/.git (core.fsmonitor, hooks/pre-commit)" in said[0], made.notes()
    assert made.outputs[-1]["content"]["data"]["text/plain"] == said[0]  # after the cell's own output
    again = default_kernel.run("echo again")
    assert "[git:" not in again.notes(), again.notes()


@pytest.mark.system
@pytest.mark.timeout(300)  # the first container test may build the image
def test_in_a_rootful_container_a_box_made_repository_is_inert_too(rootful_engine, tmp_path: Path, marker: Path):
    """The `container` provider binds the host's folder too: the same check at the cell's end. (Made by
    hand: the image need not have git.)"""
    from .conftest import rootful_box

    with rootful_box(rootful_engine, tmp_path, "kernel-git-quarantine") as (provider, executor):
        made = executor.run("mkdir -p notes/.git/objects notes/.git/refs/heads && "
                            "echo 'ref: refs/heads/main' > notes/.git/HEAD && "
                            f"printf '[core]\\n\\tbare = false\\n\\tfsmonitor = touch {marker}; false\\n' "
                            "> notes/.git/config")
        assert made["exit_code"] == 0, made
        said = provider.after_cell()
        subprocess.run(["git", "-C", str(tmp_path / "notes"), "status"], capture_output=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GIT_CONFIG_NOSYSTEM": "1"})
        assert not marker.exists(), "the host's git ran what the container's cell named"
        assert said and "notes/.git (core.fsmonitor)" in said, said


def test_a_redirection_out_of_the_workspace_is_set_aside(attacker_factory, project: Path, home: Path, who: str,
                                                         owner):
    """A `.git` file or a `commondir` naming a repository of the user's outside the workspace: the host's
    `git commit` in the box's folder would commit into it (and a checkout would write over its files)."""
    _user_repository(who, owner, home, home / "other")
    _user_repository(who, owner, home, project / "proj")
    attacker = attacker_factory()
    attacker.start(project)
    made = attacker.run(f"mkdir evil && echo 'gitdir: {home}/other/.git' > evil/.git && "
                        f"echo '{home}/other/.git' > proj/.git/commondir")
    assert made["exit_code"] == 0, made
    said = attacker.step(after_cell=True)["note"]
    for folder in ("evil", "proj"):
        on_host(who, owner, home, ["git", "-C", str(project / folder), "commit", "-q", "--allow-empty", "-m", "box"])
    log = on_host(who, owner, home, ["git", "-C", str(home / "other"), "log", "--format=%s"])
    assert log.split() == ["mine"], log
    assert said and "evil (.git (leads where the sandbox cannot write))" in said, said
    assert "commondir (leads where" in said, said
