"""The first program a provider runs in a box that it reaches only by running programs there (`exec`:
`ssh HOST`, `docker exec -i C`; `opensandbox`: an execd pipe session), before the runner may be in
the box: it makes the box's private runtime folder, takes the zipapp in when this version is not
there yet, starts the daemon detached (or finds it serving) or stops it, and says so in one JSON line.

The providers send this file's source, read from here, to the box's Python (see
`providers/boxed.py`), so it is one file, standard library only, and it imports at the top only
what every Python has: the modules the runner needs are looked for first, without importing them
(`lacking`), so a partial Python such as Debian's python3-minimal (no json) is named plainly and not
in a traceback. It runs on any Python 3, so it has no `from __future__` import (the `exec` provider
puts its arguments in front of this source) and its annotations name only built-in types. Once the
zipapp is in the box, the daemon is started and stopped by the runner's own `daemonctl`, as a relay
(`attach --start`) does it.

It runs as `main(argv, stdin, stdout)`:

* `argv[0]`: a JSON object: `action` (`start` or `stop`), `key` (names the daemon's folder),
  `runner_name` (the zipapp's file name, which is named by its content), `sha256` (the zipapp's),
  `cwd` (where the daemon starts, "" for the box user's home) and `linger`; optionally `runtime_dir`
  (else `$XDG_RUNTIME_DIR`, else /tmp), `start_timeout` (seconds), and `remove` with `stop` (the
  daemon's folder goes too).
* `argv[1]`: the standard-library modules the runner needs, comma-separated.
* stdin: when the zipapp is not in the box, the program says `{"need_runner": true}` and reads
  `<length>\\n` and that many bytes of the zipapp in base64 (execd has no "close stdin", so the
  length says where the zipapp ends). At the end of its input instead it stops, and that line is
  its answer: the provider runs it again with the zipapp to read.
* stdout: JSON lines, the last one the answer: `python`, `executable`, the paths (`runner`,
  `folder`, `socket`) and, after a start, `cwd` with `daemonctl.start`'s `daemon` and `reused`; or
  `{"error": ...}`. With `ack` in `argv[0]` the program then waits for one more line (or the end
  of its input) before it exits: a released OpenSandbox execd may send `exit` and close the
  connection before the last output (`controller/pty_ws.go`, `ptyExitWatcher`, docker/execd
  v1.0.10 to v1.0.18), so the answer must be read before the program ends.
  A Python that lacks modules prints one line, `LACKING_MARK` and their names, waits for the
  host's line as above when asked to (found without json, which may be what it lacks), and exits
  with status 3.
"""

import os
import sys

#: The start of the line naming the modules this Python lacks (the host reads it: `boxed.missing_modules`).
LACKING_MARK = "owsandbox-box-python-lacks:"
#: The package the box's modules are in, inside the zipapp (`bundle.PACKAGE`).
PACKAGE = "owsandbox.box"


class Failed(Exception):
    """What the answer's `error` says."""


def lacking(names: list) -> list:
    """The modules of `names` that this Python cannot import (looked for, not imported)."""
    import importlib.util

    return [name for name in names if name and importlib.util.find_spec(name) is None]


def paths(args: dict) -> dict:
    """Where things are in the box: the private runtime `root`, the zipapp (`runner`), the daemon's
    `folder` and its `socket`."""
    base = args.get("runtime_dir") or os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    root = os.path.join(base, f"owsandbox-{os.getuid()}")
    folder = os.path.join(root, args["key"])
    return {"root": root, "runner": os.path.join(root, args["runner_name"]), "folder": folder,
            "socket": os.path.join(folder, "run", "runner.sock")}


def receive_runner(runner: str, sha256: str, stdin, say) -> bool:
    """Ask for the zipapp (`say`) and write what `stdin` brings at `runner`, under a temporary name
    first so that nobody runs half of it; False when the input has ended instead."""
    import base64
    import hashlib

    say({"need_runner": True})
    line = stdin.readline()
    if not line.strip():
        return False
    size = int(line)
    data = stdin.read(size)
    if len(data) != size:
        raise Failed(f"the runner's upload was cut short ({len(data)} of {size} bytes)")
    blob = base64.b64decode(data)
    if hashlib.sha256(blob).hexdigest() != sha256:
        raise Failed("the uploaded runner does not match its hash")
    temp = f"{runner}.{os.getpid()}.tmp"
    with open(temp, "wb") as f:
        f.write(blob)
    os.replace(temp, runner)
    return True


def daemonctl(runner: str):
    """The runner's own `daemonctl` module, from the zipapp at `runner`."""
    import importlib

    if runner not in sys.path:
        sys.path.insert(0, runner)
    return importlib.import_module(PACKAGE + ".daemonctl")


def start(args: dict, where: dict, stdin, say):
    """Make sure the key's daemon serves: what to add to the answer, or None when the zipapp is
    missing and the input has ended (the `need_runner` line is then the answer)."""
    os.makedirs(where["root"], mode=0o700, exist_ok=True)
    os.chmod(where["root"], 0o700)
    answer = {}
    if not os.path.exists(where["runner"]):
        if not receive_runner(where["runner"], args.get("sha256"), stdin, say):
            return None
        answer["uploaded"] = True
    cwd = args["cwd"] or os.path.expanduser("~")
    if not os.path.isdir(cwd):
        raise Failed(f"no such folder in the box: {cwd}")
    os.makedirs(where["folder"], mode=0o700, exist_ok=True)
    answer["cwd"] = cwd
    ctl = daemonctl(where["runner"])
    try:
        serve = ["--cwd", cwd, "--linger", str(args["linger"]), *args.get("serve_args", [])]
        answer.update(ctl.start(where["folder"], serve, where["runner"], args.get("start_timeout", 20)))
    except ctl.DaemonError as exc:
        raise Failed(str(exc)) from None
    return answer


def stop(args: dict, where: dict) -> None:
    """End the key's daemon, if it has a folder; with `remove`, the folder goes too."""
    if not os.path.isdir(where["folder"]):
        return
    if os.path.exists(where["runner"]):
        daemonctl(where["runner"]).stop(where["folder"], remove=bool(args.get("remove")))
    elif args.get("remove"):
        import shutil

        shutil.rmtree(where["folder"], ignore_errors=True)


def main(argv: list, stdin, stdout) -> int:
    """Run the action `argv` asks for (see the module's docstring); `stdin` is binary, `stdout` text."""
    missing = lacking(argv[1].split(",") if len(argv) > 1 else [])
    if missing:
        stdout.write(LACKING_MARK + " " + " ".join(missing) + "\n")
        stdout.flush()
        if '"ack": true' in argv[0]:
            stdin.readline()  # the host read the line: only now may the program end
        return 3
    import json

    def say(message: dict) -> None:
        stdout.write(json.dumps(message) + "\n")
        stdout.flush()

    args = json.loads(argv[0])
    where = paths(args)
    out = {"python": sys.version.split()[0], "executable": sys.executable, "runner": where["runner"],
           "folder": where["folder"], "socket": where["socket"]}
    try:
        if args["action"] == "start":
            started = start(args, where, stdin, say)
            if started is None:
                return 0
            out.update(started)
        elif args["action"] == "stop":
            stop(args, where)
    except Failed as exc:
        out = {"error": str(exc)}
    say(out)
    if args.get("ack"):
        stdin.readline()  # the host read the answer: only now may the program end
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], sys.stdin.buffer, sys.stdout))
