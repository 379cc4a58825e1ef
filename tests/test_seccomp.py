"""The box's system-call filter, run through a small classic-BPF interpreter on made-up seccomp_data:
every decision of the policy on both architectures, the architecture check, x32, and arguments whose
high half is set. One test loads the program into the real kernel, in a child process."""

from __future__ import annotations

import ctypes
import os
import platform
import struct
import subprocess
import sys

import pytest

from owsandbox.host.isolation import seccomp as S

ALLOW = S.SECCOMP_RET_ALLOW
EPERM = S.SECCOMP_RET_ERRNO | S.EPERM
ENOSYS = S.SECCOMP_RET_ERRNO | S.ENOSYS


def run_bpf(program: bytes, nr: int, arch: int, args: tuple[int, ...] = ()) -> int:
    """What the kernel would decide: classic BPF as seccomp allows it (loads of the data, jumps, returns)."""
    data = struct.pack("<IIQ6Q", nr, arch, 0x401000, *(list(args) + [0] * (6 - len(args))))
    code = [struct.unpack_from("<HBBI", program, i) for i in range(0, len(program), 8)]
    acc, pc = 0, 0
    while True:
        op, jt, jf, k = code[pc]
        pc += 1
        if op == 0x20:  # ld [k]
            assert k % 4 == 0 and k + 4 <= len(data), f"load outside seccomp_data at {k}"
            acc = struct.unpack_from("<I", data, k)[0]
        elif op == 0x15:  # jeq #k
            pc += jt if acc == k else jf
        elif op == 0x45:  # jset #k
            pc += jt if acc & k else jf
        elif op == 0x06:  # ret #k
            return k
        else:
            raise AssertionError(f"instruction {op:#x} is not one this interpreter (or the policy) uses")


def decide(name: str, *args: int, arch: S.Arch = S.X86_64, rlimits: bool = False) -> int:
    program = S.compile_filter(S.box_policy(rlimits), arch)
    return run_bpf(program, arch.numbers[name], arch.audit_arch, args)


@pytest.mark.unit
@pytest.mark.parametrize("arch", [S.X86_64, S.AARCH64], ids=["x86_64", "aarch64"])
def test_what_is_always_refused(arch: S.Arch):
    enosys = {"io_uring_setup", "io_uring_enter", "io_uring_register", "clone3", "openat2"}
    always = ["keyctl", "add_key", "request_key", "userfaultfd", "perf_event_open", "bpf", "kexec_load",
              "kexec_file_load", "open_by_handle_at", "name_to_handle_at", "pidfd_getfd", "process_vm_readv",
              "process_vm_writev", "init_module", "finit_module", "delete_module", "acct", "swapon", "swapoff",
              "reboot", "settimeofday", "clock_settime", "clock_adjtime", "mount", "umount2", "pivot_root",
              "move_mount", "open_tree", "fsopen", "fsmount", "fspick", "setns", *enosys]
    for name in always:
        assert decide(name, 0, 0, 0, 0, arch=arch) == (ENOSYS if name in enosys else EPERM), name


@pytest.mark.unit
@pytest.mark.parametrize("arch", [S.X86_64, S.AARCH64], ids=["x86_64", "aarch64"])
def test_ordinary_calls_are_allowed(arch: S.Arch):
    numbers = {"x86_64": {"read": 0, "write": 1, "mmap": 9, "execve": 59, "getpid": 39, "ptrace": 101},
               "aarch64": {"read": 63, "write": 64, "mmap": 222, "execve": 221, "getpid": 172, "ptrace": 117}}
    program = S.compile_filter(S.box_policy(True), arch)
    for name, nr in numbers[arch.name].items():
        assert run_bpf(program, nr, arch.audit_arch, (3, 0, 0)) == ALLOW, name
    assert run_bpf(program, 999, arch.audit_arch) == ALLOW  # a call newer than the table: the kernel decides


@pytest.mark.unit
def test_a_foreign_architecture_is_refused_whatever_the_number():
    """i386 calls from a 64-bit box have other numbers (5 is open there): none of them gets through."""
    program = S.compile_filter(S.box_policy(), S.X86_64)
    for nr in (0, 1, 5, 11, 15, 120, 250):
        assert run_bpf(program, nr, S.AUDIT_ARCH_I386) == ENOSYS, nr
    assert run_bpf(program, 0, S.AUDIT_ARCH_AARCH64) == ENOSYS
    arm = S.compile_filter(S.box_policy(), S.AARCH64)
    assert run_bpf(arm, 63, S.AUDIT_ARCH_X86_64) == ENOSYS
    assert run_bpf(arm, 63, S.AUDIT_ARCH_AARCH64) == ALLOW


@pytest.mark.unit
def test_the_x32_abi_is_refused():
    program = S.compile_filter(S.box_policy(), S.X86_64)
    for nr in (0, 1, 90, 250, 512 + 3):  # read, write, chmod, keyctl, and an x32-only number
        assert run_bpf(program, S.X32_SYSCALL_BIT | nr, S.AUDIT_ARCH_X86_64, (0, 0o4755)) == ENOSYS, nr


@pytest.mark.unit
@pytest.mark.parametrize("arch", [S.X86_64, S.AARCH64], ids=["x86_64", "aarch64"])
def test_no_setuid_or_setgid_mode(arch: S.Arch):
    chmods = {"chmod": 1, "fchmod": 1, "fchmodat": 2, "fchmodat2": 2, "creat": 1, "mknod": 1, "mknodat": 2}
    for name, mode_arg in chmods.items():
        if name not in arch.numbers:
            assert arch.name == "aarch64" and name in ("chmod", "creat", "mknod")
            continue
        for mode, expected in ((0o4755, EPERM), (0o2755, EPERM), (0o6777, EPERM), (0o104755, EPERM),
                               (0o755, ALLOW), (0o1777, ALLOW), (0o100644, ALLOW)):
            args = [3, 0x7FFF0000, 0, 0]
            args[mode_arg] = mode
            assert decide(name, *args, arch=arch) == expected, (name, oct(mode))
        # the kernel keeps only the low bits of a mode: a high half neither hides nor adds the bits
        args = [3, 0x7FFF0000, 0, 0]
        args[mode_arg] = (0xFFFFFFFF << 32) | 0o755
        assert decide(name, *args, arch=arch) == ALLOW, name
        args[mode_arg] = (0x1 << 32) | 0o4755
        assert decide(name, *args, arch=arch) == EPERM, name


@pytest.mark.unit
@pytest.mark.parametrize("arch", [S.X86_64, S.AARCH64], ids=["x86_64", "aarch64"])
def test_creating_a_file_with_a_setid_mode(arch: S.Arch):
    o_rdwr, o_directory = 0o2, (0o200000 if arch.name == "x86_64" else 0o40000)
    opens = [("openat", 2, 3)] + ([("open", 1, 2)] if "open" in arch.numbers else [])
    for name, flags_arg, mode_arg in opens:
        def call(flags: int, mode: int, name: str = name, flags_arg: int = flags_arg, mode_arg: int = mode_arg) -> int:
            args = [0xFFFFFF9C, 0x7FFF0000, 0, 0]  # AT_FDCWD, a path
            args[flags_arg], args[mode_arg] = flags, mode
            return decide(name, *args, arch=arch)

        assert call(S.O_CREAT | o_rdwr, 0o4755) == EPERM, name
        assert call(S.O_CREAT, 0o2700) == EPERM, name
        assert call(S.O_TMPFILE_BIT | o_directory | o_rdwr, 0o4755) == EPERM, name  # made unnamed, linked in later
        assert call(S.O_CREAT | o_rdwr, 0o644) == ALLOW, name
        assert call(o_rdwr, 0o4755) == ALLOW, name  # no file made: the mode means nothing
        assert call((0xFFFFFFFF << 32) | o_rdwr, 0o4755) == ALLOW, name  # flags are an int: high half ignored
        assert call(S.O_CREAT, (0x5 << 32) | 0o4755) == EPERM, name


@pytest.mark.unit
@pytest.mark.parametrize("arch", [S.X86_64, S.AARCH64], ids=["x86_64", "aarch64"])
def test_no_new_user_namespace(arch: S.Arch):
    clone_thread = 0x3D0F00  # what pthread_create passes
    assert decide("clone", clone_thread, arch=arch) == ALLOW
    assert decide("clone", 0x11, arch=arch) == ALLOW  # fork: SIGCHLD
    assert decide("clone", S.CLONE_NEWUSER | 0x11, arch=arch) == EPERM
    assert decide("clone", (0xFFFFFFFF << 32) | 0x11, arch=arch) == ALLOW
    assert decide("unshare", S.CLONE_NEWUSER, arch=arch) == EPERM
    assert decide("unshare", 0x20000, arch=arch) == ALLOW  # CLONE_NEWNS: refused by the kernel (no capability)
    assert decide("unshare", 0x400, arch=arch) == ALLOW  # CLONE_FILES, which programs do use
    assert decide("setns", 3, S.CLONE_NEWUSER, arch=arch) == EPERM
    assert decide("clone3", 0x7FFF0000, 88, arch=arch) == ENOSYS


@pytest.mark.unit
@pytest.mark.parametrize("arch", [S.X86_64, S.AARCH64], ids=["x86_64", "aarch64"])
def test_personality(arch: S.Arch):
    for allowed in S.PERSONALITIES:
        assert decide("personality", allowed, arch=arch) == ALLOW, hex(allowed)
    for refused in (0x0040000, 0x0400000, 0x0020001, 0x1):  # ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC, ...
        assert decide("personality", refused, arch=arch) == EPERM, hex(refused)
    assert decide("personality", (0x1 << 32) | 0x0040000, arch=arch) == EPERM


@pytest.mark.unit
@pytest.mark.parametrize("arch", [S.X86_64, S.AARCH64], ids=["x86_64", "aarch64"])
def test_terminal_injection_ioctls(arch: S.Arch):
    for cmd in (S.TIOCSTI, S.TIOCLINUX):
        assert decide("ioctl", 0, cmd, 0x7FFF0000, arch=arch) == EPERM, hex(cmd)
        # ioctl's cmd is an unsigned int: the kernel drops a high half, and so does the filter
        assert decide("ioctl", 0, (0xFFFFFFFF << 32) | cmd, arch=arch) == EPERM, hex(cmd)
    for cmd in (0x5401, 0x5413, 0x5414, 0x541B, 0x80045430):  # TCGETS, TIOCGWINSZ, TIOCSWINSZ, FIONREAD, ...
        assert decide("ioctl", 0, cmd, arch=arch) == ALLOW, hex(cmd)
    assert decide("ioctl", S.TIOCSTI, 0x5401, arch=arch) == ALLOW  # the fd is not the command


@pytest.mark.unit
@pytest.mark.parametrize("arch", [S.X86_64, S.AARCH64], ids=["x86_64", "aarch64"])
def test_memory_outside_the_address_space_only_under_rlimits(arch: S.Arch):
    for name in ("memfd_create", "memfd_secret", "shmget"):
        assert decide(name, 0, 1 << 30, arch=arch, rlimits=False) == ALLOW, name
        assert decide(name, 0, 1 << 30, arch=arch, rlimits=True) == EPERM, name
    counted = len(S.refused_syscalls(S.box_policy(True), arch)) - len(S.refused_syscalls(S.box_policy(), arch))
    assert counted == 3


@pytest.mark.unit
def test_the_tables_agree_where_numbers_are_shared():
    """io_uring and newer calls have one number on every architecture; the rest were read off the
    kernel's tables. Every name the policy uses is in one table at least, and no number is used twice."""
    policy_names = {rule.syscall for rule in S.box_policy(True)}
    for table in (S.X86_64_NUMBERS, S.AARCH64_NUMBERS):
        assert len(set(table.values())) == len(table)
    assert policy_names <= set(S.X86_64_NUMBERS)
    assert policy_names - set(S.AARCH64_NUMBERS) == {"open", "creat", "chmod", "mknod", "iopl", "ioperm", "uselib"}
    for name in S.AARCH64_NUMBERS:
        if S.AARCH64_NUMBERS[name] >= 403:
            assert S.X86_64_NUMBERS[name] == S.AARCH64_NUMBERS[name], name


@pytest.mark.unit
def test_the_program_is_one_the_kernel_takes():
    for arch in (S.X86_64, S.AARCH64):
        program = S.compile_filter(S.box_policy(True), arch)
        assert len(program) % 8 == 0 and len(program) // 8 <= S.BPF_MAXINSNS
        assert struct.unpack_from("<HBBI", program, len(program) - 8) == (0x06, 0, 0, ALLOW)
    assert S.native_arch("x86_64") is S.X86_64 and S.native_arch("arm64") is S.AARCH64
    with pytest.raises(S.UnsupportedArchitecture, match="riscv64"):
        S.native_arch("riscv64")


@pytest.mark.unit
def test_a_rule_that_cannot_be_compiled_is_named():
    with pytest.raises(ValueError, match="32 bits"):
        S.equals(1, 1 << 32)
    with pytest.raises(ValueError, match="not an argument test"):
        S.ArgTest(7, "equals", (1,))
    many = [S.Rule("personality", S.EPERM, (S.not_in(0, tuple(range(300))),))]
    with pytest.raises(ValueError, match="8-bit"):
        S.compile_filter(many, S.X86_64)


_LOADER = r"""
import ctypes, os, struct, sys
program = sys.stdin.buffer.read()
libc = ctypes.CDLL(None, use_errno=True)
buffer = ctypes.create_string_buffer(program)
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
prog = Prog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
assert libc.prctl(22, 2, ctypes.byref(prog), 0, 0) == 0, os.strerror(ctypes.get_errno())  # SECCOMP_MODE_FILTER
for name, nr, args in [("keyctl", {keyctl}, (0, -3, 0)), ("memfd_create", {memfd}, (b"x", 0))]:
    ctypes.set_errno(0)
    print(name, libc.syscall(nr, *args), ctypes.get_errno())
fd = os.open("made", os.O_CREAT | os.O_WRONLY, 0o644)
try:
    os.fchmod(fd, 0o4755)
    print("fchmod allowed")
except PermissionError:
    print("fchmod refused")
os.fchmod(fd, 0o700)
print("plain fchmod", oct(os.stat("made").st_mode & 0o7777))
"""


def test_the_real_kernel_decides_as_the_interpreter(tmp_path):
    """The same bytes loaded with prctl in a child: the kernel takes the program and refuses as above."""
    try:
        arch = S.native_arch()
    except S.UnsupportedArchitecture:
        pytest.skip(f"no table for {platform.machine()}")
    if not hasattr(ctypes.CDLL(None), "prctl"):
        pytest.skip("no prctl here")
    program = S.compile_filter(S.box_policy(memory_by_rlimits=True), arch)
    code = _LOADER.replace("{keyctl}", str(arch.numbers["keyctl"]))
    code = code.replace("{memfd}", str(arch.numbers["memfd_create"]))
    done = subprocess.run([sys.executable, "-c", code], input=program, capture_output=True, cwd=tmp_path, timeout=30)
    assert done.returncode == 0, done.stderr.decode()
    lines = done.stdout.decode().splitlines()
    assert lines == ["keyctl -1 1", "memfd_create -1 1", "fchmod refused", "plain fchmod 0o700"], lines
    assert os.stat(tmp_path / "made").st_mode & 0o7777 == 0o700
