"""The snapshot store (owsandbox/host/snapshots/), on real folders: a restore gives back exactly the
tree that was saved and writes nothing outside the workspace, whatever the box left there (links out,
a folder replaced by a link, a FIFO); unchanged contents are kept once; the limit holds; a store that
is not what the host made is refused. The box's side (the store out of its reach, restores of what it
planted, as root and as a plain user) is in tests/security/test_snapshot_attacks.py; through a real
kernel, in tests/test_kernel_snapshots.py."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from owsandbox.host.snapshots.store import (
    BASELINE,
    Scope,
    SnapshotError,
    SnapshotStore,
    SnapshotTooLarge,
    StoreTampered,
    check_name,
    refuse_visible,
    snapshot_limit,
    store_root,
)

from .file_trees import MB, tree, with_times


def disk_usage(root: Path) -> int:
    """Bytes on disk under `root`, each inode once (what `du` counts)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for folder, folders, files in os.walk(root):
        for name in [*folders, *files]:
            info = os.lstat(os.path.join(folder, name))
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                total += info.st_blocks * 512
    return total


@pytest.fixture
def place(tmp_path: Path) -> dict[str, Path]:
    """A workspace, a folder outside it with a file the box would like to reach, and a private store."""
    workspace, outside, store = tmp_path / "ws", tmp_path / "outside", tmp_path / "store"
    workspace.mkdir()
    outside.mkdir()
    store.mkdir(mode=0o700)
    (outside / "secret.txt").write_text("the host's own file\n")
    (outside / "notes").mkdir()
    return {"ws": workspace, "outside": outside, "store": store}


def lab(workspace: Path, big: int = 50 * MB) -> None:
    """A small lab: text files, a folder, an executable, a read-only file, links in and out, a FIFO,
    an empty file and a large one."""
    (workspace / "data").mkdir()
    (workspace / "data" / "fruit.txt").write_text("apple\nbanana\ncherry\n")
    (workspace / "notes.md").write_text("# notes\n")
    (workspace / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(workspace / "run.sh", 0o755)
    (workspace / "frozen.txt").write_text("read only\n")
    os.chmod(workspace / "frozen.txt", 0o444)
    (workspace / "empty").write_bytes(b"")
    (workspace / "deep" / "er" / "est").mkdir(parents=True)
    (workspace / "deep" / "er" / "est" / "leaf.txt").write_text("leaf\n")
    os.symlink("data/fruit.txt", workspace / "fruit-link")
    os.symlink("../outside/secret.txt", workspace / "out-link")
    os.symlink("/etc/passwd", workspace / "absolute-link")
    os.mkfifo(workspace / "pipe")
    with open(workspace / "big.bin", "wb") as handle:
        block = os.urandom(MB)
        for number in range(big // MB):
            handle.write(number.to_bytes(4, "big") + block[4:])


@pytest.mark.unit
def test_a_restore_gives_back_the_saved_tree_and_touches_nothing_outside(place):
    workspace, outside = place["ws"], place["outside"]
    lab(workspace)
    store = SnapshotStore(place["store"], limit=1 << 30)
    saved = store.save("start", str(workspace))
    assert (saved.files, saved.links) == (7, 3)
    assert saved.skipped == [("pipe", "a FIFO, not saved")]
    expected, outside_before = tree(workspace), with_times(outside)

    # The box changes, deletes and adds: through the links too, and a folder becomes a link out.
    (workspace / "data" / "fruit.txt").write_text("mango\n")
    os.chmod(workspace / "run.sh", 0o600)
    os.unlink(workspace / "notes.md")
    os.unlink(workspace / "big.bin")
    (workspace / "added.txt").write_text("new\n")
    (workspace / "added-folder" / "inside").mkdir(parents=True)
    os.mkfifo(workspace / "added-pipe")
    os.unlink(workspace / "fruit-link")
    os.symlink("/etc/shadow", workspace / "fruit-link")
    os.unlink(workspace / "frozen.txt")
    os.symlink(str(outside / "secret.txt"), workspace / "frozen.txt")  # a restore must not write through it
    import shutil

    shutil.rmtree(workspace / "deep" / "er")
    os.symlink(str(outside / "notes"), workspace / "deep" / "er")  # ... nor into it
    os.unlink(workspace / "empty")
    os.mkdir(workspace / "empty")

    restored = store.restore("start", str(workspace))
    assert tree(workspace) == expected  # contents, modes, links as links, the FIFO that was there
    assert with_times(outside) == outside_before  # nothing outside written, not even a time
    assert restored.removed >= 4 and restored.written >= 4
    assert (workspace / "big.bin").stat().st_size == 50 * MB
    assert os.readlink(workspace / "out-link") == "../outside/secret.txt"  # still a link, never followed
    assert "pipe" in [path for path, _ in restored.kept]


@pytest.mark.unit
def test_unchanged_files_are_kept_once_and_not_read_again(place):
    workspace = place["ws"]
    (workspace / "a.txt").write_text("same\n")
    (workspace / "b.bin").write_bytes(os.urandom(3 * MB))
    (workspace / "copy.bin").write_bytes((workspace / "b.bin").read_bytes())  # same content, other name
    os.utime(workspace / "a.txt", (0, 0))
    store = SnapshotStore(place["store"], limit=1 << 30)
    first = store.save("one", str(workspace))
    assert first.new_bytes == 3 * MB + 5  # the two copies are one content
    time.sleep(2.2)  # out of the window in which a later change could share the ctime of the save
    store.save("two", str(workspace))
    again = store.save("three", str(workspace))
    assert again.read_bytes == 0 and again.new_bytes == 0
    (workspace / "a.txt").write_text("changed\n")
    changed = store.save("four", str(workspace))
    assert changed.read_bytes == len("changed\n") and changed.new_bytes == len("changed\n")
    assert [info.name for info in store.list()] == ["four", "one", "three", "two"]


@pytest.mark.unit
def test_a_snapshot_saved_again_replaces_the_old_and_drop_frees_what_only_it_held(place):
    workspace = place["ws"]
    (workspace / "x").write_bytes(os.urandom(MB))
    store = SnapshotStore(place["store"], limit=1 << 30)
    store.save("a", str(workspace))
    (workspace / "x").write_bytes(os.urandom(MB))
    again = store.save("a", str(workspace))
    assert again.replaced and store.usage() == MB  # the first content went with the old snapshot
    store.save("b", str(workspace))
    assert store.drop("a") == 0  # b still holds the content
    assert store.drop("b") == MB and store.usage() == 0
    with pytest.raises(SnapshotError, match=r"no snapshot named 'b' \(saved: none yet\)"):
        store.drop("b")


@pytest.mark.unit
def test_the_limit_is_a_clear_error_and_nothing_of_the_save_is_kept(place):
    workspace = place["ws"]
    (workspace / "small").write_bytes(os.urandom(MB))
    store = SnapshotStore(place["store"], limit=3 * MB)
    store.save("fits", str(workspace))
    (workspace / "large").write_bytes(os.urandom(4 * MB))
    with pytest.raises(SnapshotTooLarge, match=r"past its limit of 3 MiB .*OWSANDBOX_SNAPSHOT_LIMIT"):
        store.save("too-big", str(workspace))
    assert [info.name for info in store.list()] == ["fits"] and store.usage() == MB
    assert sorted(os.listdir(place["store"] / "snapshots")) == ["fits"]


def test_twenty_snapshots_of_200_mb_with_one_file_changed_each_use_about_one_copy(place):
    """Twenty snapshots, each after one 10 MB file of twenty changed: 200 MB plus the nineteen changed
    files, not twenty copies (4 GB); `du` says so."""
    workspace = place["ws"]
    for number in range(20):
        (workspace / f"part-{number:02}.bin").write_bytes(os.urandom(10 * MB))
    time.sleep(2.2)
    store = SnapshotStore(place["store"], limit=8 << 30)
    for number in range(20):
        with open(workspace / f"part-{number:02}.bin", "r+b") as handle:
            handle.write(os.urandom(16))  # one file changed before each save
        store.save(f"s{number:02}", str(workspace))
    used = disk_usage(place["store"])
    du = int(subprocess.run(["du", "-sk", str(place["store"])], capture_output=True, text=True,
                            check=True).stdout.split()[0]) * 1024
    assert abs(du - used) < 4 * MB  # du counts as disk_usage does: each hard-linked content once
    assert du < 400 * MB, f"the store uses {du / MB:.0f} MB for 20 snapshots of 200 MB"
    assert store.usage() == 200 * MB + 19 * 10 * MB  # every changed file once more: each save's one new content


@pytest.mark.unit
def test_what_the_box_cannot_write_is_neither_saved_nor_put_back(place):
    workspace = place["ws"]
    (workspace / ".git" / "hooks").mkdir(parents=True)
    (workspace / ".git" / "hooks" / "pre-commit").write_text("#!/bin/sh\necho the user's hook\n")
    (workspace / "work.txt").write_text("mine\n")
    scope = Scope(excluded={".git/hooks": "git hooks"})
    store = SnapshotStore(place["store"], limit=1 << 30)
    saved = store.save("s", str(workspace), scope)
    assert saved.excluded == [(".git/hooks", "git hooks")]
    (workspace / ".git" / "hooks" / "pre-commit").write_text("#!/bin/sh\necho changed outside the box\n")
    (workspace / ".git" / "hooks" / "post-checkout").write_text("#!/bin/sh\n")
    (workspace / "work.txt").write_text("changed\n")
    store.restore("s", str(workspace), scope)
    assert (workspace / "work.txt").read_text() == "mine\n"
    assert (workspace / ".git" / "hooks" / "pre-commit").read_text() == "#!/bin/sh\necho changed outside the box\n"
    assert (workspace / ".git" / "hooks" / "post-checkout").exists()


@pytest.mark.unit
def test_at_the_top_of_a_home_nothing_is_added_or_removed(place):
    home = place["ws"]
    (home / "lesson").mkdir()
    (home / "lesson" / "a.txt").write_text("a\n")
    scope = Scope(fixed={""})
    store = SnapshotStore(place["store"], limit=1 << 30)
    store.save("s", str(home), scope)
    (home / "thesis").mkdir()  # made by the user outside the box (the box cannot make it there)
    (home / "lesson" / "a.txt").write_text("changed\n")
    (home / "lesson" / "b.txt").write_text("added\n")
    report = store.restore("s", str(home), scope)
    assert (home / "thesis").is_dir() and ("thesis", "left: nothing at the top of the home is removed") in report.kept
    assert sorted(os.listdir(home / "lesson")) == ["a.txt"] and (home / "lesson" / "a.txt").read_text() == "a\n"


@pytest.mark.unit
def test_setuid_and_setgid_bits_are_never_put_back(place):
    workspace = place["ws"]
    (workspace / "tool").write_bytes(b"\x7fELF")
    os.chmod(workspace / "tool", 0o4755)
    store = SnapshotStore(place["store"], limit=1 << 30)
    store.save("s", str(workspace))
    os.unlink(workspace / "tool")
    report = store.restore("s", str(workspace))
    assert stat.S_IMODE(os.stat(workspace / "tool").st_mode) == 0o755 and report.setuid_dropped == ["tool"]


@pytest.mark.unit
def test_a_folder_the_owner_may_not_write_is_restored_with_its_mode(place):
    workspace = place["ws"]
    (workspace / "locked").mkdir()
    (workspace / "locked" / "a.txt").write_text("a\n")
    os.chmod(workspace / "locked", 0o555)
    store = SnapshotStore(place["store"], limit=1 << 30)
    store.save("s", str(workspace))
    os.chmod(workspace / "locked", 0o755)
    (workspace / "locked" / "b.txt").write_text("b\n")
    os.chmod(workspace / "locked", 0o500)
    store.restore("s", str(workspace))
    assert sorted(os.listdir(workspace / "locked")) == ["a.txt"]
    assert stat.S_IMODE(os.stat(workspace / "locked").st_mode) == 0o555


# -- the store is the host's ---------------------------------------------------------------------

def planted_store(place: dict[str, Path]) -> SnapshotStore:
    (place["ws"] / "a.txt").write_text("a\n")
    store = SnapshotStore(place["store"], limit=1 << 30)
    store.save("s", str(place["ws"]))
    return store


@pytest.mark.unit
def test_a_link_planted_in_the_store_is_refused(place):
    store = planted_store(place)
    sha = hashlib.sha256(b"a\n").hexdigest()
    bucket = place["store"] / "objects" / sha[:2]
    for entry in bucket.iterdir():
        entry.unlink()
    bucket.rmdir()
    bucket.symlink_to(place["outside"])  # a bucket of contents that leads out of the store
    before = with_times(place["outside"])
    (place["ws"] / "a.txt").write_text("b\n")
    with pytest.raises(StoreTampered, match="is a link or a file, not the folder the host made"):
        store.save("t", str(place["ws"]))
    assert [info.name for info in store.list()] == ["s"]
    store.restore("s", str(place["ws"]))  # the snapshot's own hard link still holds its content
    assert (place["ws"] / "a.txt").read_text() == "a\n"
    assert with_times(place["outside"]) == before


@pytest.mark.unit
def test_a_snapshot_file_replaced_by_a_link_is_refused(place):
    store = planted_store(place)
    files = place["store"] / "snapshots" / "s" / "files"
    for entry in files.iterdir():
        entry.unlink()
        entry.symlink_to(place["outside"] / "secret.txt")
    (place["ws"] / "a.txt").unlink()
    with pytest.raises(StoreTampered, match="is a link, not a file the host made"):
        store.restore("s", str(place["ws"]))
    assert not (place["ws"] / "a.txt").exists()


@pytest.mark.unit
def test_a_manifest_that_leads_out_of_the_workspace_is_refused(place):
    store = planted_store(place)
    manifest = place["store"] / "snapshots" / "s" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"a.txt"', '"../outside/pwned"'))
    with pytest.raises(StoreTampered, match="not inside the workspace"):
        store.restore("s", str(place["ws"]))
    assert sorted(os.listdir(place["outside"])) == ["notes", "secret.txt"]


@pytest.mark.unit
def test_a_store_open_to_others_is_refused(place):
    store = planted_store(place)
    os.chmod(place["store"], 0o755)
    with pytest.raises(StoreTampered, match="not this user's private folder"):
        store.list()


@pytest.mark.unit
def test_the_store_is_never_where_a_box_could_see_it(tmp_path, monkeypatch):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with pytest.raises(SnapshotError, match="inside the workspace"):
        refuse_visible(str(workspace / "store"), str(workspace))
    with pytest.raises(SnapshotError, match="which sandboxes see"):
        refuse_visible("/usr/local/share/snapshots", str(workspace))
    monkeypatch.setenv("OWSANDBOX_SNAPSHOT_DIR", str(workspace / ".snapshots"))
    with pytest.raises(SnapshotError, match="OWSANDBOX_SNAPSHOT_DIR to a folder outside it"):
        store_root(str(workspace))
    (tmp_path / "shortcut").symlink_to(workspace)  # the user's own link into the workspace
    monkeypatch.setenv("OWSANDBOX_SNAPSHOT_DIR", str(tmp_path / "shortcut" / "store"))
    with pytest.raises(SnapshotError, match="would be inside the workspace"):
        store_root(str(workspace))
    monkeypatch.setenv("OWSANDBOX_SNAPSHOT_DIR", str(tmp_path / "mine"))
    folder = store_root(str(workspace))
    assert folder.parent == tmp_path / "mine" and stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert (folder / "workspace.txt").read_text() == f"{workspace}\n"


@pytest.mark.unit
def test_names_and_settings_are_checked():
    assert check_name("before-lab_2.1") == "before-lab_2.1" and check_name(BASELINE) == BASELINE
    for bad in ("", ".hidden", "a/b", "../x", "x" * 65, "with space"):
        with pytest.raises(SnapshotError, match="a snapshot name is"):
            check_name(bad)
    assert snapshot_limit({}) == 4 << 30 and snapshot_limit({"OWSANDBOX_SNAPSHOT_LIMIT": "500M"}) == 500 * MB
    with pytest.raises(SnapshotError, match="is not a size"):
        snapshot_limit({"OWSANDBOX_SNAPSHOT_LIMIT": "lots"})


@pytest.mark.unit
def test_a_save_killed_half_way_is_tidied_by_the_next(place):
    store = planted_store(place)
    (place["store"] / "snapshots" / ".new-dead").mkdir()
    (place["store"] / "objects" / ".in-dead").write_bytes(b"half")
    store.save("t", str(place["ws"]))
    assert sorted(os.listdir(place["store"] / "snapshots")) == ["s", "t"]
    assert ".in-dead" not in os.listdir(place["store"] / "objects")


@pytest.mark.unit
def test_a_save_right_after_a_restore_reads_none_of_what_it_wrote(place):
    """The restore knows what it wrote (nothing else writes meanwhile), so the next save reads none of it."""
    workspace = place["ws"]
    (workspace / "a.bin").write_bytes(os.urandom(MB))
    store = SnapshotStore(place["store"], limit=1 << 30)
    store.save("s", str(workspace))
    (workspace / "a.bin").unlink()
    store.restore("s", str(workspace))
    assert store.save("t", str(workspace)).read_bytes == 0


@pytest.mark.unit
def test_providers_without_a_box_the_host_can_stop_are_refused_by_name(tmp_path):
    from owsandbox.host.providers import ExecProvider, LocalProvider
    from owsandbox.host.providers.opensandbox import OpenSandboxProvider
    from owsandbox.host.snapshots.stopped import SnapshotsRefused, target_of

    for provider, why in ((LocalProvider(cwd=tmp_path), "it runs commands on this machine with your permissions"),
                          (ExecProvider(tmp_path, prefix="ssh me@box"), "its box keeps its files where this machine "
                                                                        "cannot reach them"),
                          (OpenSandboxProvider(url="http://127.0.0.1:1", box_cwd="/w"), "the files are in the "
                                                                                         "OpenSandbox sandbox")):
        with pytest.raises(SnapshotsRefused) as refused:
            target_of(provider)
        assert str(refused.value).startswith(f"snapshots are not available with the {provider.name} provider: {why}")


@pytest.mark.unit
def test_a_tree_of_more_entries_than_a_snapshot_takes_is_a_clear_error(place, monkeypatch):
    from owsandbox.host.snapshots import walk as snapshots  # where a tree is listed

    monkeypatch.setattr(snapshots, "MAX_ENTRIES", 50)
    for number in range(60):
        (place["ws"] / f"f{number}").write_text("x")
    store = SnapshotStore(place["store"], limit=1 << 30)
    with pytest.raises(SnapshotTooLarge, match="more than 50 files, folders and links"):
        store.save("s", str(place["ws"]))
    assert store.list() == []


@pytest.mark.unit
def test_a_box_that_makes_files_without_end_cannot_block_a_restore(place, monkeypatch):
    """Past what a listing holds, a restore removes everything as it reads it, then puts the snapshot back."""
    from owsandbox.host.snapshots import walk as snapshots  # where a tree is listed

    workspace = place["ws"]
    (workspace / "lab").mkdir()
    (workspace / "lab" / "a.txt").write_text("a\n")
    store = SnapshotStore(place["store"], limit=1 << 30)
    scope = Scope(excluded={"keep.txt": "the guard's"})
    (workspace / "keep.txt").write_text("not the box's\n")
    store.save("s", str(workspace), scope)
    expected = tree(workspace)
    monkeypatch.setattr(snapshots, "MAX_ENTRIES", 20)
    for number in range(40):
        (workspace / "lab" / f"junk-{number}").write_text("junk")
    store.restore("s", str(workspace), scope)
    assert tree(workspace) == expected


@pytest.mark.unit
def test_a_kernelspec_names_a_baseline_folder_or_snapshot(tmp_path):
    from owsandbox.kernelspec import kernel_dict

    lab = tmp_path / "lab1"
    lab.mkdir()
    assert kernel_dict(baseline=str(lab))["env"]["OWSANDBOX_BASELINE"] == str(lab)
    assert kernel_dict(baseline="lab-start")["env"]["OWSANDBOX_BASELINE"] == "lab-start"
    with pytest.raises(ValueError, match="is not a folder"):
        kernel_dict(baseline=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="a snapshot name is"):
        kernel_dict(baseline="two words")
