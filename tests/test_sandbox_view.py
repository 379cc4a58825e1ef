"""`%sandbox`'s words: every provider's description sums up in the same few rows, and `--all` reads as rows.

The descriptions are what each provider's `describe()` gives (with the kernel's rows on top), as the
kernel tests and the provider tests see them for real."""

from __future__ import annotations

import json
import re

import pytest

from owsandbox.kernel.magics.sandbox_view import FOOTER, MAX_SUMMARY_ROWS, as_json, every_row, summary

KERNEL = {"instance_id": "43509b78", "restarts": 0, "reconnects": 0, "runner_pid": 2, "runner_version": "0.1.0",
          "os": "Linux 6.18", "bash": "bash 5.2.15(1)-release", "uptime_s": 0.4, "current shell": "main",
          "terminal": "on a 120x50 terminal; stderr apart", "cell time limit": "off",
          "output limit": "4,000,000 characters", "shells": ["main", "other"]}
BWRAP = {"provider": "bwrap", "enforcement": "bubblewrap", "cwd": "/home/ada/proj",
         "socket": "/tmp/owsandbox-0/kernel-x/run/runner.sock", "daemon_pid": 5959, "network": "none",
         "network note": "own network namespace with loopback only; no host socket is mounted",
         "mounts": {"/usr": "read-only", "/bin": "link into /usr", "/etc": "read-only",
                    "/etc/shadow-": "hidden (owner-only file)", "/etc/.pwd.lock": "hidden (owner-only file)",
                    "/etc/postgresql/15/main/pg_hba.conf": "hidden (owner-only file)",
                    "/etc/shadow": "hidden (owner-only file)", "/etc/gshadow": "hidden (owner-only file)",
                    "/proc": "own (PID namespace)", "/dev": "minimal", "/dev/shm": "private, at most 64 MiB",
                    "/tmp": "private, at most 1 GiB", "/var/tmp": "private, at most 1 GiB",
                    "/run": "private, at most 1 GiB", "/home/ada": "private (empty home)",
                    "/home/ada/proj": "read-write (the workspace)",
                    "/home/ada/proj/.venv": "read-only (a Python environment)",
                    "/home/ada/proj/.git/hooks": "read-only (git hooks)",
                    "/home/ada/proj/tmux-0": "hidden (socket)"},
         "limits": {"memory": "4 GiB", "processes": "1024", "/tmp": "1 GiB", "/dev/shm": "64 MiB", "cpu": "all"},
         "limits enforced by": "cgroup v1 (/sys/fs/cgroup/memory/owsandbox-13db, /sys/fs/cgroup/pids/owsandbox-13db)",
         "seccomp": "on (58 system calls refused, in whole or for some arguments: the kernel keyrings, io_uring)",
         "environment": "HOME, LANG, OWSANDBOX_SANDBOX, PATH, TERM, USER",
         "privileges": "none (user namespace, every capability dropped)", "pid namespace": "own",
         "workspace guard": {"read-only in the workspace": ".venv (a Python environment), .git/hooks (git hooks)",
                             "workspace scan": "12 folders, all read"},
         "dies with": "its last client (linger)", **KERNEL}
LOCAL = {"provider": "local", "enforcement": "none", "cwd": "/home/ada/proj", "socket": "/tmp/x/run/runner.sock",
         "daemon_pid": 41, **KERNEL}
AUTO_FALLBACK = {**LOCAL,
                 "note": "no isolation: bubblewrap (bwrap) is not installed, so the sandbox is the local machine"}
EXEC = {"provider": "exec", "enforcement": "the box", "command": "ssh me@host", "socket": "/run/owsandbox/host.sock",
        "runner": "/run/owsandbox/host.pyz", "box cwd": "~", "cwd": "/home/me", "host folder": "/home/ada/proj",
        **KERNEL}
OPENSANDBOX = {"provider": "opensandbox", "enforcement": "the OpenSandbox sandbox",
               "endpoint": "http://execd.example:44772", "socket": "/tmp/x", "runner": "/tmp/r.pyz", "box cwd": "~",
               "cwd": "/workspace", "host folder": "/home/ada/proj", **KERNEL}
LIFECYCLE = {"provider": "opensandbox", "enforcement": "the OpenSandbox sandbox", "server": "http://osb.example:8080",
             "sandbox id": "3f2c1d", "image": "python:3.12",
             "expires": "2026-12-01 10:00:00 UTC, renewed every 200 s while the kernel runs", "timeout": "600 s",
             "made by": "this kernel",
             "limits": {"memory": "2 GiB (resourceLimits.memory 2048Mi)", "cpu": "1 (resourceLimits.cpu 1000m)",
                        "processes": "the server's own setting (the lifecycle API has no process limit)"},
             "endpoint": "http://osb.example:8080/sandboxes/3f2c1d/port/44772", "endpoint headers": "none",
             "dies with": "its kernel: deleted at shutdown; after a restart or a crash it lives until its timeout",
             "socket": "/tmp/x", "runner": "/tmp/r.pyz", "box cwd": "~", "cwd": "/root", "host folder": "/home/ada",
             **KERNEL}
CONTAINER = {"provider": "container", "enforcement": "a container", "engine": "podman (/usr/bin/podman)",
             "image": "localhost/owsandbox-teaching:1", "image id": "9d1f", "container": "owsandbox-0-kernel-x",
             "container id": "77ab", "made by": "this kernel", "network": "none (--network none)",
             "mounts": {"/workspace": "read-write: /home/ada/course of this machine", "/": "read-only (the image)",
                        "/tmp": "private, at most 1 GiB", "/var/tmp": "private, at most 1 GiB",
                        "/dev/shm": "private, at most 64 MiB",
                        "/run/owsandbox": "private, at most 1 GiB (the runner's)",
                        "/root": "private (empty home), at most 1 GiB",
                        "/workspace/.venv": "read-only (a Python environment)"},
             "limits": {"memory": "1 GiB", "processes": "256", "/tmp": "1 GiB", "/dev/shm": "64 MiB", "cpu": "all"},
             "limits enforced by": "the engine (--memory, --pids-limit); confirmed, and events read from cgroup v1",
             "privileges": "every capability dropped, no-new-privileges",
             "environment": "OWSANDBOX_SANDBOX (and the image's own)",
             "dies with": "its kernel: removed at shutdown; after a restart or a crash it lingers 35 s for the next "
                          "kernel", "socket": "/run/owsandbox/host.sock", "runner": "/run/owsandbox/r.pyz",
             "box cwd": "/workspace", "cwd": "/workspace", "host folder": "/home/ada/course", **KERNEL}
FAILED = {"provider": "bwrap", "enforcement": "bubblewrap", "cwd": "/home/ada/proj",
          "error": "the bwrap sandbox could not start: LimitTooSmall: memory=16M is too small", "current shell": "main",
          "terminal": "on a 120x50 terminal; stderr apart", "cell time limit": "off",
          "output limit": "4,000,000 characters"}
EVERY = {"bwrap": BWRAP, "local": LOCAL, "auto falling back": AUTO_FALLBACK, "exec": EXEC, "opensandbox": OPENSANDBOX,
         "opensandbox lifecycle": LIFECYCLE, "container": CONTAINER}


def rows_of(info: dict) -> dict[str, str]:
    return dict(summary(info))


@pytest.mark.unit
@pytest.mark.parametrize("name", list(EVERY))
def test_every_providers_description_sums_up_in_the_rows_a_user_knows(name):
    rows = summary(EVERY[name])
    assert len(rows) <= MAX_SUMMARY_ROWS
    labels = [label for label, _ in rows]
    assert labels[:4] == ["Isolation", "Writes to", "Network", "Limits"], labels
    assert {"Shells", "Cell limits", "Sandbox"} <= set(labels)
    for label, value in rows:
        assert value and "{" not in value and "_" not in label and len(value) < 200, (label, value)
        assert not re.search(r"\b\d{4,}\b", value) or label in ("Expires", "Sandbox id", "Server", "Reached through"), (
            label, value)  # counts have their thousands marked


@pytest.mark.unit
def test_the_bubblewrap_summary_says_what_is_written_hidden_read_only_and_limited():
    rows = rows_of(BWRAP)
    assert rows["Isolation"] == ("bubblewrap, privileges: none (user namespace, every capability dropped), own PID "
                                 "namespace")
    assert rows["Writes to"] == ("/home/ada/proj (the workspace); private /dev/shm, /tmp, /var/tmp, /run, the home "
                                 "/home/ada (gone with the sandbox)")
    assert rows["Network"].startswith("none: own network namespace with loopback only")
    assert rows["Limits"] == ("memory 4 GiB, processes 1,024, /tmp 1 GiB, /dev/shm 64 MiB, CPUs all; enforced by "
                              "cgroup v1")
    assert rows["Hidden from the box"] == ("everything of this machine but the mounts; in them, 5 owner-only files of "
                                           "/etc (/etc/shadow, /etc/gshadow and 3 more), 1 socket in the workspace "
                                           "(/home/ada/proj/tmux-0)")
    assert rows["Read-only in the workspace"] == ".venv (a Python environment), .git/hooks (git hooks)"
    assert rows["Seccomp"].startswith("on: 58 system calls refused")
    assert rows["Shells"] == "main (current), other: on a 120x50 terminal, stderr apart"
    assert rows["Cell limits"] == "no time limit; output up to 4,000,000 characters"
    assert rows["Sandbox"] == "bwrap provider, up 0.4 s, no restarts of the box, runner 0.1.0"
    kept = rows_of({**BWRAP, "kept": True, "uptime_s": 63.2, "up_since": "10:41:07", "restarts": 1})
    assert kept["Sandbox"] == ("bwrap provider, box kept from before the kernel's restart, up 63.2 s (since 10:41:07), "
                               "box restarted 1 time, runner 0.1.0")
    assert "runner.sock" not in " ".join(rows.values()) and "cgroup/" not in rows["Limits"]


@pytest.mark.unit
def test_the_summary_counts_the_folders_pinned_above_what_is_read_only():
    mounts = {**BWRAP["mounts"], "/home/ada/proj/.git": "pinned: bound onto itself, the box cannot rename or remove it"}
    rows = rows_of({**BWRAP, "mounts": mounts})
    assert rows["Read-only in the workspace"] == (".venv (a Python environment), .git/hooks (git hooks); 1 folder "
                                                  "above them pinned (cannot be renamed or removed)")


@pytest.mark.unit
def test_a_box_elsewhere_says_where_commands_start_and_how_it_is_reached():
    assert rows_of(EXEC)["Starts in"] == "/home/me of the box (this notebook's folder here: /home/ada/proj)"
    assert rows_of(EXEC)["Reached through"] == "ssh me@host" and rows_of(EXEC)["Network"] == "the box's own network"
    lifecycle = rows_of(LIFECYCLE)
    assert lifecycle["Image"] == "python:3.12" and lifecycle["Sandbox id"] == "3f2c1d"
    assert lifecycle["Limits"].startswith("memory 2 GiB (resourceLimits.memory 2048Mi), CPUs 1")
    container = rows_of(CONTAINER)
    assert container["Writes to"].startswith("/workspace (/home/ada/course of this machine); private /tmp")
    assert container["Read-only in the workspace"] == ".venv (a Python environment)"
    assert container["Lifetime"].startswith("ends with its kernel: removed at shutdown")


@pytest.mark.unit
def test_no_isolation_is_said_plainly_and_why_when_auto_fell_back():
    assert rows_of(LOCAL)["Isolation"] == "none: commands run on this machine with your permissions"
    assert rows_of(AUTO_FALLBACK)["Isolation"].startswith("no isolation: bubblewrap (bwrap) is not installed")
    assert rows_of(LOCAL)["Writes to"] == "anything you can write on this machine"


@pytest.mark.unit
def test_a_sandbox_that_did_not_start_says_why_first():
    rows = summary(FAILED)
    assert rows[0] == ("Error", FAILED["error"])


@pytest.mark.unit
def test_every_detail_reads_as_rows_with_nested_dicts_flattened_and_keys_in_words():
    rows = dict(every_row(BWRAP))
    assert rows["workspace guard: workspace scan"] == "12 folders, all read"
    assert rows["limits: memory"] == "4 GiB" and rows["instance id"] == "43509b78" and rows["uptime"] == "0.4 s"
    assert "mounts" not in rows and not any("_" in label for label in rows)
    assert not any(value.startswith("{") for value in rows.values())


@pytest.mark.unit
def test_the_raw_description_is_json_as_it_is():
    data, text = as_json({**BWRAP, "odd": {1, 2} and object()})
    assert data["instance_id"] == "43509b78" and data["mounts"]["/usr"] == "read-only"
    assert json.loads(text) == data and isinstance(data["odd"], str)
    assert "--all" in FOOTER and "--json" in FOOTER
