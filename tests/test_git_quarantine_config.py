"""Box-made git configurations as text: what git may keep reading, what moves aside.

The unit tests feed text and read text (no process). The tests marked otherwise check the parser
against git's own (`git config --file F --list`), and the host-side check on a real workspace: which
files it counts as the box's (changed since the start, outside the guard's read-only mounts) and
which as the user's own.
"""

from __future__ import annotations

import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from owsandbox.host.isolation.gitquarantine import (
    ConfigSyntaxError,
    Entry,
    GitQuarantine,
    Protection,
    parse_config,
    plain_url,
    sanitise_config,
)
from owsandbox.host.isolation.guard import guard_workspace

INIT = "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n\tlogallrefupdates = true\n"

# Keys that name a program (or a file git then reads, or a helper): each must move.
NAMING_A_PROGRAM = {
    "core.fsmonitor": "touch /x",
    "core.pager": "touch /x",
    "core.editor": "touch /x",
    "core.sshCommand": "touch /x",
    "core.askPass": "/x",
    "core.hooksPath": ".githooks",
    "core.gitProxy": "/x",
    "core.worktree": "/",
    "core.attributesFile": "/x",
    "credential.helper": "!touch /x",
    "diff.external": "/x",
    "diff.evil.textconv": "/x",
    "diff.evil.command": "/x",
    "filter.evil.clean": "/x",
    "filter.evil.process": "/x",
    "merge.evil.driver": "/x",
    "gpg.program": "/x",
    "gpg.ssh.program": "/x",
    "alias.st": "!touch /x",
    "include.path": "/x",
    "includeIf.gitdir:/.path": "/x",
    "sequence.editor": "/x",
    "remote.origin.uploadpack": "/x",
    "remote.origin.receivepack": "/x",
    "remote.origin.vcs": "evil",
    "submodule.s.update": "!touch /x",
    "uploadpack.packObjectsHook": "/x",
    "commit.gpgSign": "true",
    "protocol.ext.allow": "always",
    "web.browser": "/x",
    "extensions.partialClone": "origin",
}


def _config(name: str, value: str) -> str:
    section, _, rest = name.partition(".")
    if "." in rest:
        sub, _, key = rest.rpartition(".")
        return f'[{section} "{sub}"]\n\t{key} = {value}\n'
    return f"[{section}]\n\t{rest} = {value}\n"


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(NAMING_A_PROGRAM))
def test_a_key_that_names_a_program_moves(name: str) -> None:
    done = sanitise_config(INIT + _config(name, NAMING_A_PROGRAM[name]) + "[user]\n\tname = Box\n")
    assert done.changed
    assert [n.lower() for n in done.moved_names] == [name.lower()]
    assert parse_config(done.kept) == parse_config(INIT + "[user]\n\tname = Box\n")
    assert NAMING_A_PROGRAM[name].split()[-1] in done.moved


@pytest.mark.unit
def test_what_git_init_writes_and_a_repositorys_ordinary_keys_stay_as_they_are() -> None:
    text = (INIT + '[remote "origin"]\n\turl = https://example.com/r.git\n'
            "\tfetch = +refs/heads/*:refs/remotes/origin/*\n"
            '[branch "main"]\n\tremote = origin\n\tmerge = refs/heads/main\n\trebase = true\n'
            "[user]\n\tname = A Person\n\temail = a@example.com\n[init]\n\tdefaultBranch = main\n")
    done = sanitise_config(text.replace("defaultBranch", "defaultbranch"))
    assert not done.changed and done.moved == "" and done.moved_names == []


@pytest.mark.unit
@pytest.mark.parametrize("url, plain", [
    ("https://example.com/r.git", True), ("git@example.com:r.git", True), ("ssh://h/r", True), ("../r", True),
    ("/srv/r.git", True), ("file:///srv/r", True),
    ("ext::sh -c touch% /x", False), ("fd::17", False), ("evil::https://example.com", False),
    ("ssh://-oProxyCommand=touch /x/r", False), ("-oProxyCommand=x:r", False), ("gopher://h/r", False),
    ("https://h/r\n", False), ("", False),
])
def test_only_plain_urls_stay(url: str, plain: bool) -> None:
    assert plain_url(url) is plain
    done = sanitise_config(f'[remote "o"]\n\turl = "{url.replace(chr(10), "")}"\n' if "\n" not in url
                           else '[remote "o"]\n\turl = "https://h/r\\n"\n')
    assert (done.moved_names == []) is plain, done


@pytest.mark.unit
def test_pull_with_an_editor_moves() -> None:
    assert sanitise_config('[branch "m"]\n\trebase = interactive\n').moved_names == ["branch.m.rebase"]


@pytest.mark.unit
def test_git_syntax_is_read_as_git_reads_it() -> None:
    text = ("\ufeff# comment\n[Core]  ; a comment\n\tBare = false # trailing\n"
            "[core] fsmonitor = \"touch /x; \\\n  false\"\n"
            "[section.Sub]\n\tkey\n"
            '[diff "a\\"b\\\\c"]\n\ttextconv = cat\n'
            "[user]\n\tname =   A   \"B  C\"  \\t ; x\n")
    assert parse_config(text) == [
        Entry("core", None, "bare", "false"),
        Entry("core", None, "fsmonitor", "touch /x;   false"),
        Entry("section", "sub", "key", None),
        Entry("diff", 'a"b\\c', "textconv", "cat"),
        Entry("user", None, "name", "A   B  C  \t"),  # as git: each space outside quotes kept, before more text
    ]


@pytest.mark.unit
def test_a_key_on_a_section_line_is_caught() -> None:
    done = sanitise_config("[core]\n\tbare = false\n[core] pager = touch /x\n")
    assert done.moved_names == ["core.pager"] and "pager" not in done.kept


@pytest.mark.unit
@pytest.mark.parametrize("text", [
    "[core\n\tpager = x\n", "pager = x\n", "[core]\n\tpager = \"x\n", "[core]\n\tpager = \\q\n",
    "[core]\n\t9pager = x\n", "[core]\n\tpager x\n", "[a b]\n", "[core]\n\tbare = false\0\n",
])
def test_text_git_would_refuse_moves_whole(text: str) -> None:
    with pytest.raises(ConfigSyntaxError):
        parse_config(text)
    done = sanitise_config(text)
    assert done.changed and done.kept == "" and done.moved == text
    assert done.moved_names[0].startswith("(the whole file")


@pytest.mark.unit
def test_the_kept_text_is_canonical_and_stable() -> None:
    text = '[core]\n  bare=false\n[user]\n\tname = "  spaced  "\n\temail = a@b ; c\n[core]\n\tpager = x\n'
    done = sanitise_config(text)
    assert done.kept == '[core]\n\tbare = false\n[user]\n\tname = "  spaced  "\n\temail = a@b\n'
    again = sanitise_config(done.kept)
    assert not again.changed and again.kept == done.kept


# -- against git's own parser, and on a real workspace (processes: not unit) -----------------------------

TRICKY = [
    INIT + '[remote "o"]\n\turl = https://e/r\n[core] pager = "less \\\n -R" ; c\n',
    '[a.B]\n\tk = v\n[a "B"]\n\tk = "x;y#z"\n\tflag\n[x]\n\ty = a\\tb\\\\c\\"d\n',
    "\ufeff[User]\n\tName = \"A  B\"  # c\n\teMail=x@y\n",
    '[diff "a\\"b"]\n\ttextconv = cat\n[sec "sp ace"]\n\tk = 1\n',
]


@pytest.mark.parametrize("text", TRICKY)
def test_the_parser_agrees_with_git(tmp_path: Path, text: str) -> None:
    config = tmp_path / "config"
    config.write_text(text)
    listed = subprocess.run(["git", "config", "--file", str(config), "--list", "--no-includes"],
                            capture_output=True, text=True, check=True).stdout.splitlines()
    ours = [e.name if e.value is None else f"{e.name}={e.value}" for e in parse_config(text)]
    assert ours == [line for line in "\n".join(listed).split("\n")], (ours, listed)
    kept = sanitise_config(text).kept
    config.write_text(kept)
    again = subprocess.run(["git", "config", "--file", str(config), "--list"], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    assert again == [e.name if e.value is None else f"{e.name}={e.value}" for e in parse_config(kept)]


def _git(*args: str) -> None:
    subprocess.run(["git", "-c", "user.name=Me", "-c", "user.email=me@x", *args], check=True, capture_output=True)


def test_a_users_own_repository_is_never_changed_and_what_appears_beside_it_is(tmp_path: Path) -> None:
    """The guard's read-only mounts of an existing repository are the user's, and so is every file older
    than the box's start; a config.worktree, commondir target or hook made since is the box's."""
    workspace = tmp_path / "w"
    _git("init", "-q", str(workspace / "mine"))
    _git("-C", str(workspace / "mine"), "config", "core.pager", "less -S")  # the user's own choice
    _git("-C", str(workspace / "mine"), "config", "extensions.worktreeConfig", "true")
    (workspace / "mine" / ".git" / "hooks" / "pre-commit").write_text("#!/bin/sh\n")
    (workspace / "old").mkdir()
    _git("init", "-q", str(workspace / "old" / "unguarded"))
    time.sleep(0.2)
    guard = guard_workspace(str(workspace), "/nonexistent")
    quarantine = GitQuarantine(str(workspace), Protection.at_start(guard))
    assert quarantine.check().repositories == {}
    user_config = (workspace / "mine" / ".git" / "config").read_text()
    # the user changes their own config on the host while the box runs: still theirs
    _git("-C", str(workspace / "mine"), "config", "core.editor", "vi")
    (workspace / "mine" / ".git" / "config.worktree").write_text("[core]\n\tfsmonitor = touch /x\n")
    _git("init", "-q", str(workspace / "new"))
    _git("-C", str(workspace / "new"), "config", "core.fsmonitor", "touch /x")
    report = quarantine.check()
    assert set(report.repositories) == {str(workspace / "mine" / ".git"), str(workspace / "new" / ".git")}
    assert report.repositories[str(workspace / "mine" / ".git")] == ["config.worktree: core.fsmonitor"]
    assert (workspace / "mine" / ".git" / "config").read_text().startswith(user_config.split("[extensions]")[0])
    assert "\teditor = vi" in (workspace / "mine" / ".git" / "config").read_text()
    assert (workspace / "mine" / ".git" / "hooks" / "pre-commit").exists()
    assert "fsmonitor" not in (workspace / "new" / ".git" / "config").read_text()
    assert quarantine.check().repositories == {}


def test_a_protected_config_whose_folder_was_replaced_is_the_boxs(tmp_path: Path) -> None:
    workspace = tmp_path / "w"
    _git("init", "-q", str(workspace / "mine"))
    time.sleep(0.2)
    quarantine = GitQuarantine(str(workspace), Protection.at_start(guard_workspace(str(workspace), "/nonexistent")))
    git_dir = workspace / "mine" / ".git"
    os.rename(git_dir, workspace / "mine" / ".git-old")
    git_dir.mkdir()
    for name in ("HEAD", "objects", "refs"):
        os.rename(workspace / "mine" / ".git-old" / name, git_dir / name)
    (git_dir / "config").write_text("[core]\n\tfsmonitor = touch /x\n")
    assert quarantine.check().repositories == {str(git_dir): ["core.fsmonitor"]}


def test_a_link_or_fifo_as_config_is_moved_without_being_read(tmp_path: Path) -> None:
    """A link is never read through (it may lead to a file the box cannot read: the host would copy it
    into the quarantine file, where the box can), a fifo never blocks the check: both move whole."""
    workspace = tmp_path / "w"
    workspace.mkdir()
    quarantine = GitQuarantine(str(workspace), Protection(time.time_ns() - 10**8))
    _git("init", "-q", str(workspace / "a"))
    (workspace / "a" / ".git" / "config").unlink()
    os.mkfifo(workspace / "a" / ".git" / "config")
    _git("init", "-q", str(workspace / "b"))
    secret = tmp_path / "secret"
    secret.write_text("[core]\n\tpager = the host's secret\n")
    (workspace / "b" / ".git" / "config").unlink()
    (workspace / "b" / ".git" / "config").symlink_to(secret)
    report = quarantine.check()
    for name in "ab":
        git_dir = workspace / name / ".git"
        assert report.repositories[str(git_dir)] == ["config (whole: not a plain file)"]
        assert not os.path.lexists(git_dir / "config")
        assert os.path.lexists(git_dir / "owsandbox-quarantine" / "config")
    assert stat.S_ISFIFO((workspace / "a" / ".git" / "owsandbox-quarantine" / "config").lstat().st_mode)
    assert "secret" not in "".join(p.read_text() for p in workspace.rglob("*" + "quarantine") if p.is_file())
    assert secret.read_text() == "[core]\n\tpager = the host's secret\n"


def test_a_link_never_leads_the_check_out_of_what_the_box_sees(tmp_path: Path) -> None:
    """A `.git` link to a hidden folder of the home (say ~/.config/git, this user's own git config), a
    quarantine folder planted as a link to it: nothing there is read or written."""
    workspace = tmp_path / "home"
    hidden = workspace / ".config" / "git"
    hidden.mkdir(parents=True)
    (hidden / "config").write_text("[alias]\n\tmine = log\n")
    guard = guard_workspace(str(workspace), str(workspace))
    assert str(workspace / ".config") in guard.hidden
    quarantine = GitQuarantine(str(workspace), Protection.at_start(guard, since_ns=0))
    (workspace / "notes").mkdir()
    (workspace / "notes" / ".git").symlink_to(hidden)
    _git("init", "-q", str(workspace / "repo"))
    _git("-C", str(workspace / "repo"), "config", "core.pager", "touch /x")
    (workspace / "repo" / ".git" / "owsandbox-quarantine").symlink_to(hidden)
    (workspace / "repo" / ".git" / "hooks" / "pre-commit").write_text("#!/bin/sh\n")
    report = quarantine.check()
    assert report.repositories[str(workspace / "notes")] == [".git (leads where the sandbox cannot write)"]
    assert set(report.repositories) == {str(workspace / "notes"), str(workspace / "repo" / ".git")}
    assert (hidden / "config").read_text() == "[alias]\n\tmine = log\n"
    assert sorted(os.listdir(hidden)) == ["config"]
    assert (workspace / "repo" / ".git" / "owsandbox-quarantine" / "hooks" / "pre-commit").is_file()


def test_the_walk_reads_again_what_changed_since_the_last_check(tmp_path: Path) -> None:
    """The walk keeps each folder's listing while its inode and status change time stay: a repository
    made deep in a folder walked before, a `.git` file rewritten in place, and a `.git` link are found."""
    workspace = tmp_path / "w"
    (workspace / "a" / "b" / "c").mkdir(parents=True)
    (workspace / "other").mkdir()
    (workspace / "other" / ".git").write_text("gitdir: ../nowhere\n")
    quarantine = GitQuarantine(str(workspace), Protection(time.time_ns() - 10**8))
    assert quarantine.check().git_dirs == 0
    _git("init", "-q", "--bare", str(workspace / "node_modules" / "g"))
    _git("--git-dir", str(workspace / "node_modules" / "g"), "config", "core.fsmonitor", "touch /x")
    with open(workspace / "other" / ".git", "r+") as gitfile:  # in place: the folder's times do not change
        gitfile.write("gitdir: ../node_modules/g\n")
    _git("init", "-q", str(workspace / "a" / "b" / "c"))
    _git("-C", str(workspace / "a" / "b" / "c"), "config", "core.pager", "touch /x")
    (workspace / "a" / "link").mkdir()
    _git("init", "-q", "--bare", str(workspace / "node_modules" / "h"))
    _git("--git-dir", str(workspace / "node_modules" / "h"), "config", "core.editor", "touch /x")
    (workspace / "a" / "link" / ".git").symlink_to(workspace / "node_modules" / "h")
    report = quarantine.check()
    assert report.repositories == {str(workspace / "node_modules" / "g"): ["core.fsmonitor"],
                                   str(workspace / "a" / "b" / "c" / ".git"): ["core.pager"],
                                   str(workspace / "node_modules" / "h"): ["core.editor"]}


def test_a_redirection_out_of_the_workspace_is_set_aside_when_the_box_made_it(tmp_path: Path) -> None:
    workspace = tmp_path / "w"
    _git("init", "-q", str(tmp_path / "elsewhere"))
    (workspace / "mine").mkdir(parents=True)
    (workspace / "mine" / ".git").write_text(f"gitdir: {tmp_path}/elsewhere/.git\n")  # the user's own worktree
    time.sleep(0.2)
    quarantine = GitQuarantine(str(workspace), Protection(time.time_ns() - 10**8))
    (workspace / "box").mkdir()
    (workspace / "box" / ".git").write_text(f"gitdir: {tmp_path}/elsewhere/.git\n")
    (workspace / "linked").mkdir()
    (workspace / "linked" / ".git").symlink_to(tmp_path / "elsewhere" / ".git")
    report = quarantine.check()
    assert report.repositories == {str(workspace / "box"): [".git (leads where the sandbox cannot write)"],
                                   str(workspace / "linked"): [".git (leads where the sandbox cannot write)"]}
    assert (workspace / "mine" / ".git").is_file()
    assert not os.path.lexists(workspace / "box" / ".git")
    assert (workspace / "box" / ".git.owsandbox-quarantine").is_file()


def test_the_walk_goes_to_any_depth_and_says_once_where_it_stopped(tmp_path: Path, monkeypatch) -> None:
    """Depth costs the box nothing, so a repository is found however deep; the number of folders read is
    bounded, and a box that makes more (burying a repository below them) is told about in the note, once."""
    from owsandbox.host.isolation import gitquarantine

    workspace = tmp_path / "w"
    deep = workspace.joinpath(*"abcdefghij")
    deep.mkdir(parents=True)
    quarantine = GitQuarantine(str(workspace), Protection(time.time_ns() - 10**8))
    _git("init", "-q", str(deep))
    _git("-C", str(deep), "config", "core.pager", "touch /x")
    report = quarantine.check()
    assert report.repositories == {str(deep / ".git"): ["core.pager"]} and not report.unchecked
    monkeypatch.setattr(gitquarantine, "SCAN_FOLDERS", 5)
    for n in range(10):
        (workspace / f"flood{n}").mkdir()
    first, second = quarantine.check(), quarantine.check()
    assert first.unchecked and second.unchecked
    said = first.note(str(workspace))
    assert said is not None and "more than 5 folders" in said
    assert second.note(str(workspace)) is None


def test_what_the_box_cannot_write_or_see_is_not_walked(tmp_path: Path) -> None:
    """A read-only environment (a thousand folders of site-packages) and the home's hidden dot entries
    are not walked; an environment the box made is, and so is one whose folder was replaced."""
    home = tmp_path / "home"
    for folder in (home / "proj" / ".venv", home / ".cache"):
        for n in range(30):
            (folder / f"lib{n}").mkdir(parents=True)
    (home / "proj" / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (home / ".cache" / "x").mkdir(parents=True)
    time.sleep(0.2)
    guard = guard_workspace(str(home), str(home))
    assert str(home / "proj" / ".venv") in guard.read_only and str(home / ".cache") in guard.hidden
    quarantine = GitQuarantine(str(home), Protection.at_start(guard))
    _git("init", "-q", str(home / ".cache" / "x"))
    _git("-C", str(home / ".cache" / "x"), "config", "core.pager", "touch /x")
    report = quarantine.check()
    assert report.repositories == {} and report.folders < 10, report
    os.rename(home / "proj" / ".venv", home / "proj" / "venv-old")  # the box's own in its place
    _git("init", "-q", str(home / "proj" / ".venv"))
    _git("-C", str(home / "proj" / ".venv"), "config", "core.pager", "touch /x")
    assert quarantine.check().repositories == {str(home / "proj" / ".venv" / ".git"): ["core.pager"]}
