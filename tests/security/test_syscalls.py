"""Cell code calls what the box's system-call filter refuses: the host's keyrings, io_uring, bpf, perf
events, userfaultfd, new user namespaces, and a setuid program left in the workspace for someone on
the host to run. Each attack runs as root and as a plain user; each refusal has a test beside it
that ordinary work (pip, git, a C compiler, multiprocessing, ps, top) still runs."""

from __future__ import annotations

import json
import os
import platform
import pwd
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from owsandbox.host.isolation import seccomp

from ..plain_python import as_user
from .conftest import PLAIN_USER, Attacker, plain_user


def python_in_box(code: str) -> str:
    return f"python3 -c {shlex.quote(code)}"


def raw_calls(calls: dict[str, str]) -> str:
    """A box command that makes each raw system call (name: the Python argument list after the number)
    and prints {name: [result, errno]} as JSON."""
    numbers = seccomp.native_arch().numbers
    lines = ["import ctypes, json, os", "libc = ctypes.CDLL(None, use_errno=True)",
             "libc.syscall.restype = ctypes.c_long", "done = {}"]
    for name, args in calls.items():
        lines += ["ctypes.set_errno(0)",
                  f"done[{name!r}] = [libc.syscall({numbers[name]}{', ' if args else ''}{args}), ctypes.get_errno()]"]
    lines.append("print(json.dumps(done))")
    return python_in_box("\n".join(lines))


def answers(done: dict) -> dict[str, list[int]]:
    assert done["exit_code"] == 0, done
    return json.loads(done["output"].strip().splitlines()[-1])


@pytest.fixture
def open_workspace(owner: pwd.struct_passwd) -> Iterator[Path]:
    """A workspace any host user may enter, as a shared course folder is: what the box leaves in it,
    another user could run."""
    folder = Path(tempfile.mkdtemp(prefix="owsbx-ws-"))
    os.chown(folder, owner.pw_uid, owner.pw_gid)
    os.chmod(folder, 0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_the_hosts_session_keyring_is_out_of_reach(attacker_factory, home: Path):
    """The kernel's keyrings are not namespaced: without the filter, the box read the secret below."""
    if not shutil.which("keyctl"):
        if os.environ.get("CI"):
            pytest.fail("CI must have keyutils (keyctl)")
        pytest.skip("keyutils (keyctl) is not installed")
    holds_a_secret = ("keyctl", "session", "-", "sh", "-c",
                      'keyctl add user owsbx-secret SECRET-IN-KEYRING @s >/dev/null && exec "$@"', "sh")
    attacker = attacker_factory(wrapper=holds_a_secret)
    attacker.start(home / "project")
    assert "SECRET-IN-KEYRING" in attacker.step(host="keyctl print %user:owsbx-secret")["output"]
    for attempt in ("keyctl show @s", "keyctl print %user:owsbx-secret", "keyctl pipe %user:owsbx-secret",
                    "keyctl read $(keyctl search @s user owsbx-secret)", "cat /proc/keys",
                    "keyctl add user box-key PLANTED @s", "keyctl add user box-key PLANTED @u",
                    "keyctl new_session", "keyctl join_session_keyring"):
        done = attacker.run(attempt)
        assert done["exit_code"] != 0 and "SECRET-IN-KEYRING" not in done["output"], (attempt, done)
    raw = answers(attacker.run(raw_calls({"keyctl": "0, -3, 0", "add_key": "b'user', b'k', b'v', 1, -3",
                                          "request_key": "b'user', b'owsbx-secret', None, 0"})))
    assert raw == {"keyctl": [-1, 1], "add_key": [-1, 1], "request_key": [-1, 1]}, raw
    host = attacker.step(host="keyctl show @s; keyctl show @u")["output"]
    assert "owsbx-secret" in host and "box-key" not in host and "PLANTED" not in host


def test_kernel_interfaces_outside_any_namespace_are_refused(attacker: Attacker):
    params = "ctypes.create_string_buffer(120)"  # io_uring_params: all zero is a valid request
    perf = "ctypes.create_string_buffer(bytes([1, 0, 0, 0, 128]) + bytes(123))"  # software clock, size 128
    done = answers(attacker.run(raw_calls({
        "io_uring_setup": f"8, {params}", "userfaultfd": "1", "perf_event_open": f"{perf}, 0, -1, -1, 0",
        "bpf": "0, ctypes.create_string_buffer(72), 72", "unshare": "0x10000000",
        "clone": "0x10000000 | 17, 0, 0, 0, 0", "setns": "0, 0", "clock_settime": "0, ctypes.create_string_buffer(16)",
        "process_vm_readv": "1, 0, 0, 0, 0, 0", "open_by_handle_at": "-100, ctypes.create_string_buffer(16), 0",
        "personality": "0x0040000", "mount": "b'none', b'/tmp', b'tmpfs', 0, None"})))
    expected = {"io_uring_setup": seccomp.ENOSYS}
    for name, (result, errno) in done.items():
        assert result == -1 and errno == expected.get(name, seccomp.EPERM), (name, result, errno)
    for attempt in ("unshare -U true", "unshare -Ur id", "setarch -R true"):
        assert attacker.run(attempt)["exit_code"] != 0, attempt
    assert "on (" in attacker.step(describe=True)["seccomp"]


def test_no_setuid_or_setgid_file_is_left_for_the_host(attacker_factory, open_workspace: Path, who: str, tmp_path):
    """A root kernel's box writes files root owns: a setuid copy of python3 in the workspace would be a
    root shell for any user on the host."""
    archive = tmp_path / "setuid.tar"
    with tarfile.open(archive, "w") as tar:
        info = tarfile.TarInfo("from-tar")
        info.mode, info.size = 0o4755, 4
        tar.addfile(info, __import__("io").BytesIO(b"#!\n\n"))
    shutil.copy(archive, open_workspace / "setuid.tar")
    os.chown(open_workspace / "setuid.tar", *_ids(who))
    attacker = attacker_factory()
    attacker.start(open_workspace)
    attacks = [
        "cp /usr/bin/python3 ./py && chmod 4755 ./py",
        "cp /usr/bin/id ./id-u && chmod u+s ./id-u",
        "cp /usr/bin/id ./id-g && chmod g+s ./id-g",
        "install -m 4755 /usr/bin/id ./id-i",
        "cp /usr/bin/id ./id-r && chmod -R 6755 ./id-r",
        "cp -p /usr/bin/passwd ./passwd-copy",
        "tar -xpf setuid.tar",
        python_in_box("import os, shutil; shutil.copy('/usr/bin/id', 'id-p'); os.chmod('id-p', 0o4755)"),
        python_in_box("import os; fd = os.open('id-f', os.O_CREAT | os.O_WRONLY, 0o644); os.fchmod(fd, 0o2755)"),
        python_in_box("import os; os.open('made-setuid', os.O_CREAT | os.O_WRONLY, 0o4755)"),
        python_in_box("import os; fd = os.open('.', os.O_TMPFILE | os.O_WRONLY, 0o4755); "
                      "os.link(f'/proc/self/fd/{fd}', 'tmpfile-setuid')"),
        python_in_box("import os, stat; os.mknod('node-setuid', stat.S_IFREG | 0o4755)"),
        python_in_box("import os; os.mkfifo('fifo-setgid', 0o2777)"),
    ]
    unrefused = []
    for attack in attacks:
        done = attacker.run(attack)
        if "not permitted" not in done["output"] and "Cannot change mode" not in done["output"]:
            unrefused.append((attack, done["output"]))
    assert len(unrefused) <= 1, unrefused  # a plain user's `cp -p` of a root program drops the bit unasked
    setid = [str(p) for p in open_workspace.rglob("*") if p.lstat().st_mode & 0o6000]
    assert setid == [], setid
    assert attacker.run("chmod 755 ./py && ./py -c 'print(42)'")["output"].endswith("42\n")  # plain modes still work
    if who == "root":
        other = plain_user()
        ran = subprocess.run(as_user(PLAIN_USER, [str(open_workspace / "py"), "-c", "import os; print(os.geteuid())"]),
                             capture_output=True, text=True, timeout=60, cwd="/")
        assert ran.stdout.strip() == str(other.pw_uid), ran


def put(path: Path, text: str, who: str) -> None:
    path.write_text(text)
    os.chown(path, *_ids(who))


def _ids(who: str) -> tuple[int, int]:
    user = pwd.getpwuid(0) if who == "root" else plain_user()
    return user.pw_uid, user.pw_gid


def _wheel(folder: Path) -> Path:
    """A tiny pure-Python wheel, written here: pip installs it with no network and no build step."""
    path = folder / "owsbx_demo-0.1-py3-none-any.whl"
    files = {"owsbx_demo/__init__.py": "ANSWER = 42\n",
             "owsbx_demo-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: owsbx-demo\nVersion: 0.1\n",
             "owsbx_demo-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                "Tag: py3-none-any\n"}
    record = "".join(f"{name},,\n" for name in files) + "owsbx_demo-0.1.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in {**files, "owsbx_demo-0.1.dist-info/RECORD": record}.items():
            wheel.writestr(name, text)
    return path


def test_ordinary_work_still_runs(attacker_factory, open_workspace: Path, who: str):
    """What students and agents do all day, under the same filter."""
    wheel = _wheel(open_workspace)
    os.chown(wheel, *_ids(who))
    attacker = attacker_factory()
    attacker.start(open_workspace)

    def ok(command: str, timeout: float = 120) -> str:
        done = attacker.run(command, timeout=timeout)
        assert done["exit_code"] == 0, (command, done)
        return done["output"]

    assert "pip" in ok("python3 -m pip --version")
    ok("python3 -m venv venv", timeout=180)
    assert "Successfully installed owsbx-demo-0.1" in ok(f"venv/bin/pip install --no-index {wheel.name}", timeout=180)
    assert ok("venv/bin/python -c 'import owsbx_demo; print(owsbx_demo.ANSWER)'").endswith("42\n")
    ok("git init -q repo && cd repo && echo hi > a.txt && git add a.txt && "
       "git -c user.name=t -c user.email=t@example.invalid commit -qm first && git log --oneline | wc -l && cd ..")
    pool = ("import multiprocessing as mp\n"
            "def square(x):\n    return x * x\n"
            "if __name__ == '__main__':\n"
            "    with mp.Pool(3) as pool:\n        print(sum(pool.map(square, range(100))))\n"
            "    q = mp.Queue(); p = mp.Process(target=q.put, args=('queued',)); p.start(); print(q.get()); p.join()\n"
            "    print(mp.Lock().acquire(), mp.Value('i', 7).value)\n")
    put(open_workspace / "pool.py", pool, who)
    assert ok("python3 pool.py").splitlines()[-3:] == ["328350", "queued", "True 7"]
    assert "bash" in ok("ps -ef") and "Tasks:" in ok("top -bn1 | head -5")
    if shutil.which("cc"):
        put(open_workspace / "hello.c", '#include <stdio.h>\nint main(void){puts("compiled");return 0;}\n', who)
        assert ok("cc -O1 -o hello hello.c && ./hello").endswith("compiled\n")
    assert ok("chmod 600 pool.py && stat -c %a pool.py").endswith("600\n")  # ordinary modes are the user's


def test_the_filter_is_what_the_architecture_table_says(attacker: Attacker):
    """Every process of the box runs filtered, bubblewrap's init (the box's pid 1) included."""
    if platform.machine() not in ("x86_64", "aarch64"):
        pytest.skip(f"no table for {platform.machine()}")
    status = attacker.run("grep -h '^Seccomp:' /proc/1/status /proc/2/status /proc/self/status")["output"]
    assert status.split() == ["Seccomp:", "2"] * 3, status
