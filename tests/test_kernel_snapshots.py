"""`%snapshot` through a real kernel: on bubblewrap and in a podman container a restore puts the files back,
ends what ran (a background job, the box's /tmp), starts the shells again in their folders and says
so; a kernelspec's baseline folder is the lab a course resets to; the other providers refuse, naming
why. The store's own rules are tested in tests/test_snapshots.py, its attacks in tests/security/."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from .conftest import DEFAULT_KERNEL_NAME, KERNEL_NAME, kernel_in, require_bwrap
from .kernel_session import KernelSession
from .processes import command_line
from .waiting import wait_until


def running_marked(marker: str) -> list[int]:
    return [int(pid) for pid in os.listdir("/proc") if pid.isdigit() and marker in command_line(int(pid))]


@pytest.fixture
def box(tmp_path: Path):
    """A bubblewrap kernel in a workspace of its own, with its snapshot store in the test's folder."""
    require_bwrap()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    baseline = tmp_path / "lab-start"
    (baseline / "data").mkdir(parents=True)
    (baseline / "data" / "fruit.txt").write_text("apple\nbanana\n")
    (baseline / "README").write_text("the lab as it starts\n")
    env = {"OWSANDBOX_PROVIDER": "bwrap", "OWSANDBOX_SNAPSHOT_DIR": str(tmp_path / "store"),
           "OWSANDBOX_BASELINE": str(baseline)}
    with kernel_in(workspace, DEFAULT_KERNEL_NAME, env) as kernel:
        yield kernel, workspace


def ok(kernel: KernelSession, code: str):
    run = kernel.run(code)
    assert run.status == "ok", run.outputs
    return run


def test_a_restore_puts_the_files_back_and_restarts_the_sandbox_saying_so(box):
    kernel, workspace = box
    ok(kernel, "mkdir -p lab/deep && cd lab && echo one > a.txt && echo keep > deep/b.txt && ln -s a.txt link")
    saved = ok(kernel, "%snapshot save before")
    assert saved.text().startswith("saved snapshot 'before': 2 files, 2 folders, 1 link, 9 B in ")
    assert "outside every box" in saved.notes()
    marker = f"owsbx-snap-{secrets.token_hex(4)}"
    ok(kernel, f"cd deep && echo two > ../a.txt && rm b.txt && echo new > ../new.txt && echo scratch > /tmp/t && "
               f"export GONE=1 && (exec -a {marker} sleep 600 &)")
    # The subshell forks and execs after the cell has ended: wait for the renamed sleep, not for the cell.
    wait_until(lambda: running_marked(marker), 10, "the background job to start")
    restored = ok(kernel, "%snapshot restore before")
    assert restored.text().startswith("restored snapshot 'before': 2 files written back, 1 entry added since "
                                      "removed, 0 folders and 0 links put back")
    assert (f"shells main (in {workspace}/lab/deep) started again in their folders, without their variables"
            in restored.notes())
    assert "its running commands ended and its /tmp is empty" in restored.notes()
    wait_until(lambda: not running_marked(marker), 10, "the background job to end with the old sandbox")
    after = ok(kernel, r'pwd; cat ../a.txt b.txt; \ls -1 ..; \ls -A /tmp; echo "[$GONE]"')
    # In the new box's /tmp, only the folder bubblewrap made on the way to the workspace (when it is in /tmp).
    on_the_way = f"{workspace.relative_to('/tmp').parts[0]}\n" if workspace.is_relative_to("/tmp") else ""
    assert after.text() == f"{workspace}/lab/deep\none\nkeep\na.txt\ndeep\nlink\n{on_the_way}[]\n"
    assert (workspace / "lab" / "link").is_symlink() and not (workspace / "lab" / "new.txt").exists()


def test_list_drop_and_clear_errors(box):
    kernel, _ = box
    ok(kernel, "echo x > x.txt")
    ok(kernel, "%snapshot save one")
    ok(kernel, "%snapshot save two")
    listed = ok(kernel, "%snapshot list").of_type("display_data")[0]["data"]["text/plain"]
    assert listed.splitlines()[0].split() == ["snapshot", "saved", "files", "folders", "links", "size"]
    assert [line.split()[0] for line in listed.splitlines()[1:3]] == ["one", "two"]
    assert "Baseline: " in listed and "(%snapshot restore --baseline)" in listed
    assert ok(kernel, "%snapshot drop one").text().startswith("dropped snapshot 'one' (freed ")
    missing = kernel.run("%snapshot restore one")
    assert (missing.error["ename"], missing.error["evalue"]) == ("SnapshotError",
                                                                  "no snapshot named 'one' (saved: two)")
    bad = kernel.run("%snapshot save ../up")
    assert bad.error["ename"] == "SnapshotError" and "a snapshot name is letters" in bad.error["evalue"]
    usage = kernel.run("%snapshot restore")
    assert usage.error["ename"] == "UsageError" and "--baseline" in usage.error["evalue"]


def test_the_baseline_is_the_lab_a_course_resets_to(box):
    kernel, workspace = box
    ok(kernel, "mkdir -p data && echo cherry >> data/fruit.txt 2>/dev/null; rm -f README; echo mine > mine.txt")
    reset = ok(kernel, "%snapshot restore --baseline")
    assert reset.text().startswith("restored the baseline: ")
    assert sorted(os.listdir(workspace)) == ["README", "data"]
    assert (workspace / "data" / "fruit.txt").read_text() == "apple\nbanana\n"
    assert ok(kernel, "cat README").text() == "the lab as it starts\n"


def test_providers_without_a_box_to_stop_refuse_with_their_reason(tmp_path):
    with kernel_in(tmp_path, KERNEL_NAME, {"OWSANDBOX_SNAPSHOT_DIR": str(tmp_path.parent / "no-store")}) as kernel:
        ok(kernel, "true")
        refused = kernel.run("%snapshot save s")
        assert refused.error["ename"] == "SnapshotsRefused"
        assert refused.error["evalue"].startswith("snapshots are not available with the local provider: it runs "
                                                  "commands on this machine with your permissions")
    assert not (tmp_path.parent / "no-store").exists()


@pytest.mark.system
def test_a_restore_in_a_podman_container_makes_a_new_container(podman, tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    env = {**podman.settings, "OWSANDBOX_PROVIDER": "container", "OWSANDBOX_IMAGE": podman.image(),
           "OWSANDBOX_ENGINE": podman.path, "OWSANDBOX_SNAPSHOT_DIR": str(tmp_path / "store")}
    with kernel_in(workspace, DEFAULT_KERNEL_NAME, env) as kernel:
        ok(kernel, "mkdir -p lab && cd lab && echo one > a.txt")
        ok(kernel, "%snapshot save s")
        ok(kernel, "echo scratch > /tmp/t; echo two > a.txt; echo new > b.txt; export GONE=1")
        restored = ok(kernel, "%snapshot restore s")
        assert "shells main (in /workspace/lab) started again in their folders" in restored.notes()
        after = ok(kernel, r'pwd; cat a.txt; \ls; \ls -A /tmp; echo "[$GONE]"').text()
        assert after == "/workspace/lab\none\na.txt\n[]\n"  # a new container: its /tmp is empty
        assert (workspace / "lab" / "a.txt").read_text() == "one\n" and not (workspace / "lab" / "b.txt").exists()
