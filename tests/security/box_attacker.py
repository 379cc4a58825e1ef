"""Runs a bubblewrap sandbox as the user who starts this script, driven by JSON lines on stdin.

The isolation tests run it as root and as a plain user (through `runuser`), with the system Python
and a world-readable copy of the package, so the same attacks are tried with both kinds of owner.
Steps (one JSON object a line; one JSON answer a line):

    {"start": {provider options}}   make the sandbox (a BwrapProvider) and answer what it says of itself
    {"run": "COMMAND"}              run a command on the main shell: exit_code, output
    {"describe": true}              the provider's describe()
    {"after_cell": true}            what the kernel does at a cell's end (provider.after_cell): its note
    {"counters": true}              the limit counters
    {"network": true|false}         turn the running box's outbound network on or off (%network): said
    {"state": true}                 the host-side facts: state folder, runner file, init pid, its pid namespace
    {"restart": true}               kill and restart the daemon as a sandbox restart does
    {"snapshot": {"action": A, "name": N}}  save, restore (the box stopped around it) or drop a snapshot of
                                    the workspace, as %snapshot does: the report, and the store's folder
    {"host": "COMMAND"}             run a command on the host, as this script's user and in its session
                                    (its keyrings): exit_code, output
    {"close": true}                 end the sandbox, then this script
    {"release": true}               leave the sandbox lingering (a kernel restart), then end this script
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


def main() -> int:
    from owsandbox.host.providers.bwrap import BwrapProvider
    from owsandbox.host.workspace import RunnerWorkspace

    workspace: RunnerWorkspace | None = None
    for line in sys.stdin:
        step = json.loads(line)
        answer: dict = {}
        try:
            if "start" in step:
                options = dict(step["start"])
                cwd = options.pop("cwd")
                workspace = RunnerWorkspace(BwrapProvider(cwd=cwd, **options), cwd)
                answer = {"started": True}
            elif "run" in step:
                assert workspace is not None
                before = workspace.provider.limit_counters()
                done = workspace.executor.run(step["run"], timeout=step.get("timeout", 60))
                answer = {**done, "counters_before": before, "counters_after": workspace.provider.limit_counters(),
                          "limits": report.to_json() if (report := workspace.provider.limit_report()) else None}
            elif "after_cell" in step:
                assert workspace is not None
                answer = {"note": workspace.provider.after_cell()}
            elif "describe" in step:
                assert workspace is not None
                answer = json.loads(json.dumps(workspace.provider.describe(), default=str))
            elif "network" in step:
                assert workspace is not None
                answer = {"said": workspace.provider.set_network(bool(step["network"]))}
            elif "counters" in step:
                assert workspace is not None
                answer = workspace.provider.limit_counters()
            elif "state" in step:
                assert workspace is not None
                provider = workspace.provider
                pid = provider.daemon_pid
                answer = {"state_dir": provider.state_dir, "runner_path": provider.runner_path,
                          "init_pid": pid, "pasta_pid": provider._pasta_pid,
                          "pidns": os.readlink(f"/proc/{pid}/ns/pid") if pid else None}
            elif "host" in step:
                done = subprocess.run(["bash", "-c", step["host"]], capture_output=True, text=True, timeout=60)
                answer = {"exit_code": done.returncode, "output": done.stdout + done.stderr}
            elif "snapshot" in step:
                assert workspace is not None
                answer = snapshot_step(workspace.provider, step["snapshot"])
            elif "restart" in step:
                assert workspace is not None
                provider = workspace.provider
                with provider._lifecycle:  # as tests/daemon_restart.py does it (this script runs alone)
                    provider._stop_daemon()
                    provider._start_daemon()
                answer = {"restarted": True}
            elif "close" in step or "release" in step:
                if workspace is not None:
                    workspace.release() if "release" in step else workspace.close()
                print(json.dumps({"closed": True}), flush=True)
                return 0
        except Exception as exc:  # noqa: BLE001 - reported to the test, which decides
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(answer), flush=True)
    if workspace is not None:
        workspace.close()
    return 0


def snapshot_step(provider: object, step: dict) -> dict:
    from dataclasses import asdict

    from owsandbox.host.snapshots.stopped import SandboxSnapshots

    snapshots = SandboxSnapshots(provider)
    action = step["action"]
    if action == "save":
        report = asdict(snapshots.save(step["name"]))
    elif action == "restore":
        report = asdict(snapshots.restore(step["name"]))
    else:
        report = {"freed": snapshots.drop(step["name"])}
    return {**report, "store": str(snapshots.store.folder)}


if __name__ == "__main__":
    sys.exit(main())
