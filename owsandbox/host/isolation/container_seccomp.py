"""The container's seccomp profile: the engine's default one, plus no setuid or setgid modes and no
kernel keyrings.

Root in a rootful container is root on the host, and the workspace is the host's folder: a
`cp /usr/bin/python3 ./py && chmod 4755 ./py` in a cell would leave a root program there for any
host user to run. `no-new-privileges` only stops such a program inside the container. So the
profile refuses (EPERM) every call that sets S_ISUID or S_ISGID: the chmod family, and making a
file with such a mode (`creat`, `mknod`, and `open`/`openat` with O_CREAT or O_TMPFILE); `openat2`,
whose mode a filter cannot read, answers ENOSYS, and programs fall back to `openat`.

The engines compile the profile with libseccomp, which compares each argument at most once per
rule and takes overlapping rules with different actions in no promised order. So each call's rules
split its arguments into cases that never overlap unless they agree: the flags masked to
O_CREAT|O_TMPFILE take each of their four values once, and a mode is either free of both bits
(allowed) or has one of them (refused). Sans-I/O: `extend_profile()` takes the default profile's
JSON and returns the new one; `default_profile_path()` only looks for the file.
"""

from __future__ import annotations

import copy
import os
from typing import Any

from .seccomp import ENOSYS, EPERM, O_CREAT, O_TMPFILE_BIT

S_ISUID, S_ISGID = 0o4000, 0o2000
# Where the engines' packages put their default profile (containers-common; Docker builds its own in,
# and uses the same format, so the same file extends it).
DEFAULT_PROFILES = ("/etc/containers/seccomp.json", "/usr/share/containers/seccomp.json")
MODE_ARG = {"chmod": 1, "fchmod": 1, "fchmodat": 2, "fchmodat2": 2, "creat": 1, "mknod": 1, "mknodat": 2}
OPEN_ARGS = {"open": (1, 2), "openat": (2, 3)}  # (flags, mode)
# The kernel's keyrings are not namespaced: root in a rootful container finds, describes and (where its
# permission lets a user read it) reads the keys in the host root's user keyring. Docker's built-in
# default refuses these calls; containers-common's profile allows keyctl.
KEYRING_CALLS = ("keyctl", "add_key", "request_key")
GUARDED = (*MODE_ARG, *OPEN_ARGS, "openat2", *KEYRING_CALLS)


def default_profile_path() -> str | None:
    """The engine's default profile on this machine, or None."""
    return next((path for path in DEFAULT_PROFILES if os.path.isfile(path)), None)


def _masked(index: int, mask: int, value: int) -> dict[str, Any]:
    return {"index": index, "value": mask, "valueTwo": value, "op": "SCMP_CMP_MASKED_EQ"}


def _rule(name: str, action: str, *args: dict[str, Any], errno: int | None = None,
          why: str = "no setuid or setgid file for the host to run") -> dict[str, Any]:
    rule: dict[str, Any] = {"names": [name], "action": action, "args": list(args), "comment": f"owsandbox: {why}"}
    if errno is not None:
        rule["errnoRet"] = errno
    return rule


def _mode_rules(name: str, mode: int, *also: dict[str, Any]) -> list[dict[str, Any]]:
    """Allowed with neither bit in the mode, refused with either (the two refusals agree where both are set)."""
    return [_rule(name, "SCMP_ACT_ALLOW", *also, _masked(mode, S_ISUID | S_ISGID, 0)),
            _rule(name, "SCMP_ACT_ERRNO", *also, _masked(mode, S_ISUID, S_ISUID), errno=EPERM),
            _rule(name, "SCMP_ACT_ERRNO", *also, _masked(mode, S_ISGID, S_ISGID), errno=EPERM)]


def no_setid_rules() -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = []
    for name, mode in MODE_ARG.items():
        rules += _mode_rules(name, mode)
    creating = O_CREAT | O_TMPFILE_BIT
    for name, (flags, mode) in OPEN_ARGS.items():
        rules.append(_rule(name, "SCMP_ACT_ALLOW", _masked(flags, creating, 0)))  # no file made: any mode
        for made in (O_CREAT, O_TMPFILE_BIT, creating):
            rules += _mode_rules(name, mode, _masked(flags, creating, made))
    rules.append(_rule("openat2", "SCMP_ACT_ERRNO", errno=ENOSYS))
    return rules


def no_keyring_rules() -> list[dict[str, Any]]:
    return [_rule(name, "SCMP_ACT_ERRNO", errno=EPERM, why="the host's keyrings, which are not namespaced")
            for name in KEYRING_CALLS]


def extend_profile(default: dict[str, Any]) -> dict[str, Any]:
    """`default` with the guarded calls taken out of its allow rules and ours put in their place."""
    if not isinstance(default.get("syscalls"), list) or "defaultAction" not in default:
        raise ValueError("not a seccomp profile in the engines' format (no defaultAction and syscalls)")
    profile = copy.deepcopy(default)
    kept = []
    for rule in profile["syscalls"]:
        if rule.get("action") == "SCMP_ACT_ALLOW":
            names = [name for name in rule.get("names", []) if name not in GUARDED]
            if not names:
                continue
            rule["names"] = names
        kept.append(rule)
    profile["syscalls"] = kept + no_setid_rules() + no_keyring_rules()
    return profile


__all__ = ["DEFAULT_PROFILES", "KEYRING_CALLS", "default_profile_path", "extend_profile", "no_keyring_rules",
           "no_setid_rules"]
