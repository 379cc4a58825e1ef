"""The system-call filter of the bubblewrap box: a policy table and the classic-BPF program made from it.

A user namespace without capabilities already stops most of what a cell could do to the machine, but
some system calls reach kernel state that no namespace separates (the keyrings, performance counters,
BPF, the clock, modules), or carry the kernel's largest attack surface (io_uring, userfaultfd), or let
the box leave something behind that the host might run: a **setuid or setgid file** in the workspace.
A box started by root writes files that root owns, so `chmod 4755` on a copied program would make a
root program that any host user could run. The filter refuses to set those mode bits, whatever the
system call (`chmod` and its relatives, or creating a file with that mode).

Modelled on Docker's default profile and Flatpak's: refusals answer EPERM, or ENOSYS where programs
fall back to an older call when a new one is missing (glibc's `clone3` to `clone`, io_uring users to
plain reads). Under rlimits (no cgroup), memory that is never mapped escapes RLIMIT_AS, so
`memfd_create`, `memfd_secret` and `shmget` are refused there too.

Sans-I/O: `box_policy()` is data, `compile_filter()` turns it into the bytes `bwrap --seccomp FD`
reads (an array of `struct sock_filter`); nothing here opens a file or applies a filter.
"""

from __future__ import annotations

import platform
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

EPERM = 1
ENOSYS = 38

# struct seccomp_data: nr (u32), arch (u32), instruction_pointer (u64), args[6] (u64 each)
_NR, _ARCH, _ARGS = 0, 4, 16

# Classic BPF as the kernel's filter/seccomp reads it
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JSET_K = 0x45
_RET_K = 0x06

SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
BPF_MAXINSNS = 4096

AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_I386 = 0x40000003
AUDIT_ARCH_AARCH64 = 0xC00000B7
X32_SYSCALL_BIT = 0x40000000

CLONE_NEWUSER = 0x10000000
O_CREAT = 0o100
O_TMPFILE_BIT = 0o20000000  # __O_TMPFILE: such a file is made with the given mode, then linked in
SETID_BITS = 0o6000  # S_ISUID | S_ISGID
TIOCSTI = 0x5412  # pushes characters into a terminal's input, as if typed
TIOCLINUX = 0x541C  # the Linux console's selection and more
# Docker's allowed personalities: Linux, Linux32, UNAME26 and both, and the query 0xffffffff.
PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)

# The numbers of the system calls the policy names, per architecture (from the kernel's
# arch/x86/entry/syscalls/syscall_64.tbl and include/uapi/asm-generic/unistd.h, which aarch64 uses).
# A name an architecture lacks (aarch64 has no `chmod`, `open`, `creat`, `mknod`) is left out there.
X86_64_NUMBERS = {
    "ioctl": 16, "shmget": 29, "open": 2, "clone": 56, "creat": 85, "chmod": 90, "fchmod": 91, "mknod": 133,
    "uselib": 134, "personality": 135, "pivot_root": 155, "acct": 163, "settimeofday": 164, "mount": 165,
    "umount2": 166, "swapon": 167, "swapoff": 168, "reboot": 169, "iopl": 172, "ioperm": 173, "init_module": 175,
    "delete_module": 176, "quotactl": 179, "lookup_dcookie": 212, "clock_settime": 227, "kexec_load": 246,
    "add_key": 248, "request_key": 249, "keyctl": 250, "openat": 257, "mknodat": 259, "fchmodat": 268,
    "unshare": 272, "perf_event_open": 298, "name_to_handle_at": 303, "open_by_handle_at": 304,
    "clock_adjtime": 305, "setns": 308, "process_vm_readv": 310, "process_vm_writev": 311, "finit_module": 313,
    "memfd_create": 319, "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425,
    "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430,
    "fsconfig": 431, "fsmount": 432, "fspick": 433, "clone3": 435, "openat2": 437, "pidfd_getfd": 438,
    "mount_setattr": 442, "quotactl_fd": 443, "memfd_secret": 447, "fchmodat2": 452,
}
AARCH64_NUMBERS = {
    "lookup_dcookie": 18, "ioctl": 29, "mknodat": 33, "umount2": 39, "mount": 40, "pivot_root": 41, "fchmod": 52,
    "fchmodat": 53, "openat": 56, "quotactl": 60, "acct": 89, "personality": 92, "unshare": 97, "kexec_load": 104,
    "init_module": 105, "delete_module": 106, "clock_settime": 112, "reboot": 142, "settimeofday": 170,
    "shmget": 194, "add_key": 217, "request_key": 218, "keyctl": 219, "clone": 220, "swapon": 224,
    "swapoff": 225, "perf_event_open": 241, "name_to_handle_at": 264, "open_by_handle_at": 265,
    "clock_adjtime": 266, "setns": 268, "process_vm_readv": 270, "process_vm_writev": 271, "finit_module": 273,
    "memfd_create": 279, "bpf": 280, "userfaultfd": 282, "kexec_file_load": 294, "io_uring_setup": 425,
    "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430,
    "fsconfig": 431, "fsmount": 432, "fspick": 433, "clone3": 435, "openat2": 437, "pidfd_getfd": 438,
    "mount_setattr": 442, "quotactl_fd": 443, "memfd_secret": 447, "fchmodat2": 452,
}


class UnsupportedArchitecture(ValueError):
    """No system-call table for this machine: the box runs without the filter, and says so."""


@dataclass(frozen=True)
class Arch:
    name: str
    audit_arch: int
    numbers: dict[str, int]
    refuse_x32: bool = False  # x86_64: the x32 ABI shares the arch value, with its own numbers


X86_64 = Arch("x86_64", AUDIT_ARCH_X86_64, X86_64_NUMBERS, refuse_x32=True)
AARCH64 = Arch("aarch64", AUDIT_ARCH_AARCH64, AARCH64_NUMBERS)
ARCHES = {"x86_64": X86_64, "amd64": X86_64, "aarch64": AARCH64, "arm64": AARCH64}


def native_arch(machine: str | None = None) -> Arch:
    """The table for this machine (or `machine`, as `platform.machine()` names it)."""
    machine = machine or platform.machine()
    try:
        return ARCHES[machine.lower()]
    except KeyError:
        raise UnsupportedArchitecture(
            f"no system-call table for the {machine} architecture (known: x86_64, aarch64)") from None


@dataclass(frozen=True)
class ArgTest:
    """A test on the low 32 bits of argument `arg`. Every argument the policy tests is an int, unsigned
    int or mode in the kernel, which drops the high half, so a high half set by the caller changes
    nothing here either."""

    arg: int
    kind: str  # "any_bit": arg & values[0] != 0; "equals": arg == values[0]; "not_in": arg not in values
    values: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.kind not in ("any_bit", "equals", "not_in") or not 0 <= self.arg < 6 or not self.values:
            raise ValueError(f"not an argument test: {self}")
        if any(not 0 <= value <= 0xFFFFFFFF for value in self.values):
            raise ValueError(f"argument test values must fit 32 bits: {self}")


def any_bit(arg: int, mask: int) -> ArgTest:
    return ArgTest(arg, "any_bit", (mask,))


def equals(arg: int, value: int) -> ArgTest:
    return ArgTest(arg, "equals", (value,))


def not_in(arg: int, values: Sequence[int]) -> ArgTest:
    return ArgTest(arg, "not_in", tuple(values))


@dataclass(frozen=True)
class Rule:
    """Refuse `syscall` with `errno` when every test in `when` holds (always, when there is none)."""

    syscall: str
    errno: int = EPERM
    when: tuple[ArgTest, ...] = field(default=())


def _always(errno: int, *names: str) -> list[Rule]:
    return [Rule(name, errno) for name in names]


def _setid_mode(syscall: str, mode_arg: int, flags_arg: int | None = None) -> Rule:
    tests = (any_bit(flags_arg, O_CREAT | O_TMPFILE_BIT),) if flags_arg is not None else ()
    return Rule(syscall, EPERM, (*tests, any_bit(mode_arg, SETID_BITS)))


def box_policy(memory_by_rlimits: bool = False) -> tuple[Rule, ...]:
    """What the bubblewrap box may not do. `memory_by_rlimits`: memory is bounded by RLIMIT_AS alone,
    which memory never mapped (a memfd written to, SysV shared memory) escapes."""
    rules = [
        # Kernel state no namespace separates, or the kernel's largest attack surface.
        *_always(EPERM, "keyctl", "add_key", "request_key", "userfaultfd", "perf_event_open", "bpf", "kexec_load",
                 "kexec_file_load", "open_by_handle_at", "name_to_handle_at", "pidfd_getfd", "process_vm_readv",
                 "process_vm_writev", "init_module", "finit_module", "delete_module", "acct", "swapon", "swapoff",
                 "reboot", "settimeofday", "clock_settime", "clock_adjtime", "iopl", "ioperm", "quotactl",
                 "quotactl_fd", "uselib", "lookup_dcookie"),
        *_always(ENOSYS, "io_uring_setup", "io_uring_enter", "io_uring_register"),
        # Mounts: the box has no capability for them anyway; refused as well, after bubblewrap's own.
        *_always(EPERM, "mount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsconfig",
                 "fsmount", "fspick", "mount_setattr", "setns"),
        Rule("unshare", EPERM, (any_bit(0, CLONE_NEWUSER),)),
        Rule("clone", EPERM, (any_bit(0, CLONE_NEWUSER),)),
        Rule("clone3", ENOSYS),  # its flags are in memory a filter cannot read; glibc falls back to clone
        Rule("personality", EPERM, (not_in(0, PERSONALITIES),)),
        Rule("ioctl", EPERM, (equals(1, TIOCSTI),)),
        Rule("ioctl", EPERM, (equals(1, TIOCLINUX),)),
        # No setuid or setgid file, whoever would run it later.
        _setid_mode("chmod", 1), _setid_mode("fchmod", 1), _setid_mode("fchmodat", 2), _setid_mode("fchmodat2", 2),
        _setid_mode("open", 2, flags_arg=1), _setid_mode("openat", 3, flags_arg=2), _setid_mode("creat", 1),
        _setid_mode("mknod", 1), _setid_mode("mknodat", 2),
        Rule("openat2", ENOSYS),  # its mode is in memory a filter cannot read; programs fall back to openat
    ]
    if memory_by_rlimits:
        rules += _always(EPERM, "memfd_create", "memfd_secret", "shmget")
    return tuple(rules)


def refused_syscalls(rules: Sequence[Rule], arch: Arch) -> list[str]:
    """The system calls the rules refuse (always or for some arguments) on `arch`: what `%sandbox` counts."""
    return list(dict.fromkeys(rule.syscall for rule in rules if rule.syscall in arch.numbers))


class _Program:
    """Instructions with symbolic jump targets, resolved to the relative offsets BPF wants."""

    def __init__(self) -> None:
        self.code: list[tuple[int, int | str, int | str, int]] = []
        self.labels: dict[str, int] = {}
        self._fresh = 0

    def label(self) -> str:
        self._fresh += 1
        return f"L{self._fresh}"

    def place(self, label: str) -> None:
        self.labels[label] = len(self.code)

    def emit(self, code: int, k: int = 0, jt: int | str = 0, jf: int | str = 0) -> None:
        self.code.append((code, jt, jf, k))

    def assemble(self, byteorder: str = "<") -> bytes:
        if len(self.code) > BPF_MAXINSNS:
            raise ValueError(f"the filter has {len(self.code)} instructions; the kernel takes at most {BPF_MAXINSNS}")
        out = bytearray()
        for index, (code, jt, jf, k) in enumerate(self.code):
            out += struct.pack(f"{byteorder}HBBI", code, self._offset(index, jt), self._offset(index, jf), k)
        return bytes(out)

    def _offset(self, index: int, target: int | str) -> int:
        if isinstance(target, int):
            return target
        offset = self.labels[target] - index - 1
        if not 0 <= offset <= 255:
            raise ValueError(f"a jump of {offset} instructions does not fit classic BPF's 8-bit offsets")
        return offset


def _low_word(arg: int) -> int:
    return _ARGS + 8 * arg  # little-endian: the low half comes first (both supported arches are)


def compile_filter(rules: Sequence[Rule], arch: Arch) -> bytes:
    """The BPF program for `rules` on `arch`: the architecture first (a foreign one, such as i386 on
    x86_64, and x32 are refused outright, as their numbers mean other calls), then each system call's
    rules in order, then allow."""
    program = _Program()
    program.emit(_LD_W_ABS, _ARCH)
    program.emit(_JEQ_K, arch.audit_arch, 1, 0)
    program.emit(_RET_K, SECCOMP_RET_ERRNO | ENOSYS)
    program.emit(_LD_W_ABS, _NR)
    if arch.refuse_x32:
        program.emit(_JSET_K, X32_SYSCALL_BIT, 0, 1)
        program.emit(_RET_K, SECCOMP_RET_ERRNO | ENOSYS)
    by_syscall: dict[str, list[Rule]] = {}
    for rule in rules:
        if rule.syscall in arch.numbers:
            by_syscall.setdefault(rule.syscall, []).append(rule)
    for name, syscall_rules in by_syscall.items():
        # Until a number matches, A holds the number; a matched block always returns.
        next_syscall = program.label()
        program.emit(_JEQ_K, arch.numbers[name], 0, next_syscall)
        for rule in syscall_rules:
            next_rule = program.label()
            for test in rule.when:
                program.emit(_LD_W_ABS, _low_word(test.arg))
                if test.kind == "any_bit":
                    program.emit(_JSET_K, test.values[0], 0, next_rule)
                elif test.kind == "equals":
                    program.emit(_JEQ_K, test.values[0], 0, next_rule)
                else:
                    for value in test.values:
                        program.emit(_JEQ_K, value, next_rule, 0)
            program.emit(_RET_K, SECCOMP_RET_ERRNO | rule.errno)
            program.place(next_rule)
            if not rule.when:
                break  # refused always: later rules for it are never reached
        program.emit(_RET_K, SECCOMP_RET_ALLOW)
        program.place(next_syscall)
    program.emit(_RET_K, SECCOMP_RET_ALLOW)
    return program.assemble()


__all__ = ["AARCH64", "X86_64", "Arch", "ArgTest", "Rule", "UnsupportedArchitecture", "box_policy",
           "compile_filter", "native_arch", "refused_syscalls"]
