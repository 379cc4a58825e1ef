"""Snapshots against a hostile box, as root and as a plain user (the attacker of conftest.py).

The host does a snapshot's file work on its own side of the workspace, so a box that could steer it
would write as the host: as root, anywhere. The box tries: it looks for the store (it must not even
see it), plants links to the host's files, to the store and to a folder of the host in place of one
of its own, and leaves a FIFO; a restore puts the tree back and writes nothing outside it. And a
store that is not what the host made (a link planted in it, however it got there) is refused.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ..file_trees import tree, with_times


@pytest.fixture
def victim(home: Path, owner) -> Path:
    """A folder of the host, outside the workspace, that the box names in its links."""
    folder = home / "victim"
    folder.mkdir()
    (folder / "secret.txt").write_text("the host's own file\n")
    (folder / "keep").mkdir()
    for path in (folder, folder / "secret.txt", folder / "keep"):
        os.chown(path, owner.pw_uid, owner.pw_gid)
    return folder


@pytest.fixture(autouse=True)
def stores(attacker) -> Iterator[None]:
    """The stores a test's snapshots made (in the attacker's private runtime folder), removed after it."""
    step = attacker.step
    made: set[str] = set()

    def recording(**kwargs: Any) -> dict[str, Any]:
        answer = step(**kwargs)
        if "snapshot" in kwargs and answer.get("store"):
            made.add(answer["store"])
        return answer

    attacker.step = recording
    yield
    for folder in made:
        shutil.rmtree(folder, ignore_errors=True)


def run_ok(attacker, command: str) -> str:
    done = attacker.run(command)
    assert done["exit_code"] == 0, done
    return done["output"]


def test_the_store_is_out_of_the_boxs_reach(attacker):
    run_ok(attacker, "mkdir -p lab && echo hello > lab/a.txt")
    token = secrets.token_hex(6)
    saved = attacker.step(snapshot={"action": "save", "name": f"s-{token}"})
    assert "error" not in saved, saved
    store = saved["store"]
    assert os.path.isdir(store) and not store.startswith(str(attacker.home / "project"))
    for probe in (f"ls -la {store}", f"cat {store}/index.json", f"ls {os.path.dirname(os.path.dirname(store))}"):
        done = attacker.run(probe)
        assert done["exit_code"] != 0 and "No such file or directory" in done["output"], (probe, done)
    found = run_ok(attacker, f"find / -path /proc -prune -o \\( -name {os.path.basename(store)} -o -name "
                             f"s-{token} \\) -print 2>/dev/null; true")
    assert found == ""  # neither the store's folder nor the snapshot's, anywhere the box can look
    # What the box makes at the store's path lands in its own /tmp, never in the host's store.
    run_ok(attacker, f"mkdir -p {store}/objects/pwned {store}/snapshots && ln -s / {store}/snapshots/pwned")
    assert sorted(os.listdir(os.path.join(store, "snapshots"))) == [f"s-{token}"]
    assert "pwned" not in os.listdir(os.path.join(store, "objects"))


def test_a_restore_writes_through_none_of_the_links_the_box_planted(attacker, victim):
    run_ok(attacker, "mkdir -p lab/sub && echo hello > lab/a.txt && echo inner > lab/sub/inner.txt && "
                     "ln -s a.txt lab/in-link")
    saved = attacker.step(snapshot={"action": "save", "name": "s"})
    assert "error" not in saved, saved
    store = Path(saved["store"])
    expected = tree(attacker.home / "project")
    outside, store_before = with_times(victim), with_times(store)

    # Links to the host's folder and files and to the store, with the host's paths (meaningless in the
    # box, which sees neither); a folder of the lab replaced by one of them; a FIFO where a file was.
    run_ok(attacker, f"rm -rf lab/sub && ln -s {victim} lab/sub && rm lab/a.txt && ln -s {victim}/secret.txt "
                     f"lab/a.txt && rm lab/in-link && ln -s {store} lab/in-link && ln -s {store}/objects lab/objects "
                     f"&& mkfifo lab/pipe && echo extra > lab/extra.txt")
    restored = attacker.step(snapshot={"action": "restore", "name": "s"})
    assert "error" not in restored, restored
    assert tree(attacker.home / "project") == expected  # a real folder again, files, the link as it was
    assert with_times(victim) == outside  # nothing written there, not even a time
    assert {path: entry for path, entry in with_times(store).items() if not path.startswith("index")} == \
        {path: entry for path, entry in store_before.items() if not path.startswith("index")}
    done = attacker.run("cat lab/sub/inner.txt lab/a.txt; ls lab")
    assert done["output"].split() == ["inner", "hello", "a.txt", "in-link", "sub"]  # a new box, the lab as saved


def test_links_saved_in_a_snapshot_stay_links_when_it_is_put_back(attacker, victim):
    """A link the box made to the host's file is saved as text; restored, it is a link again, and
    nothing it names was read into the store or written."""
    run_ok(attacker, f"mkdir -p lab && ln -s {victim}/secret.txt lab/loot && ln -s {victim} lab/loot-folder")
    saved = attacker.step(snapshot={"action": "save", "name": "s"})
    assert saved["files"] == 0 and saved["links"] == 2, saved
    store = Path(saved["store"])
    assert not [p for p in store.rglob("*") if p.is_file() and p.read_bytes() == b"the host's own file\n"]
    outside = with_times(victim)
    run_ok(attacker, "rm lab/loot lab/loot-folder")
    assert "error" not in attacker.step(snapshot={"action": "restore", "name": "s"})
    project = attacker.home / "project"
    assert os.readlink(project / "lab" / "loot") == f"{victim}/secret.txt"
    assert with_times(victim) == outside


def test_a_link_planted_in_the_store_is_refused(attacker, victim):
    """However a link got into the store (the box cannot reach it), the host refuses to use it."""
    run_ok(attacker, "mkdir -p lab && echo hello > lab/a.txt")
    saved = attacker.step(snapshot={"action": "save", "name": "s"})
    store = Path(saved["store"])
    outside = with_times(victim)
    manifest = store / "snapshots" / "s" / "manifest.json"
    manifest.unlink()
    manifest.symlink_to(victim / "secret.txt")
    restored = attacker.step(snapshot={"action": "restore", "name": "s"})
    assert restored["error"].startswith("StoreTampered: 'manifest.json' in the snapshot store is a link"), restored
    objects = store / "objects"
    for bucket in list(objects.iterdir()):
        for entry in bucket.iterdir():
            entry.unlink()
        bucket.rmdir()
    (objects / hashlib.sha256(b"hello\n").hexdigest()[:2]).symlink_to(victim / "keep")
    again = attacker.step(snapshot={"action": "save", "name": "t"})
    assert again["error"].startswith("StoreTampered:") and "not the folder the host made" in again["error"], again
    assert with_times(victim) == outside
    assert run_ok(attacker, "cat lab/a.txt") == "hello\n"  # refused before the box was stopped: it runs on
