"""The container's profile: the engine's default with the mode-setting calls taken out of its allow
list and rules put in whose cases never disagree, checked on every mode and flag case."""

from __future__ import annotations

import itertools
import json
import os

import pytest

from owsandbox.host.isolation import container_seccomp as C
from owsandbox.host.isolation.seccomp import O_CREAT, O_TMPFILE_BIT

pytestmark = pytest.mark.unit

DEFAULT = {"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 38,
           "syscalls": [{"names": ["read", "chmod", "openat", "fchmodat", "keyctl"], "action": "SCMP_ACT_ALLOW",
                         "args": []},
                        {"names": ["chmod"], "action": "SCMP_ACT_ALLOW", "args": [],
                         "includes": {"caps": ["CAP_FOWNER"]}},
                        {"names": ["openat2"], "action": "SCMP_ACT_ALLOW", "args": []},
                        {"names": ["bpf"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1, "args": []}]}


def decisions(profile: dict, name: str, args: list[int]) -> set[str]:
    """What every rule for `name` that matches `args` says (libseccomp promises no order between them)."""
    found = set()
    for rule in profile["syscalls"]:
        if name in rule["names"] and all((args[a["index"]] & a["value"]) == a["valueTwo"] for a in rule["args"]):
            found.add(rule["action"] + (f":{rule['errnoRet']}" if "errnoRet" in rule else ""))
    return found or {"default"}


def test_the_guarded_calls_leave_the_allow_list_and_the_rest_stays():
    profile = C.extend_profile(DEFAULT)
    assert profile["syscalls"][0]["names"] == ["read"]
    assert not any(r.get("includes") for r in profile["syscalls"])  # the chmod-only rule went with its names
    assert {"names": ["bpf"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1, "args": []} in profile["syscalls"]
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO" and DEFAULT["syscalls"][0]["names"][1] == "chmod"  # a copy
    assert decisions(profile, "openat2", [0] * 6) == {"SCMP_ACT_ERRNO:38"}


@pytest.mark.parametrize("name", sorted(C.MODE_ARG))
def test_a_mode_with_a_setid_bit_is_refused_and_no_other(name: str):
    profile = C.extend_profile(DEFAULT)
    for mode in (0o755, 0o644, 0o1777, 0o100755, 0o4755, 0o2755, 0o6755, 0o104000, (1 << 40) | 0o4000):
        args = [3, 0, 0, 0, 0, 0]
        args[C.MODE_ARG[name]] = mode
        expected = "SCMP_ACT_ERRNO:1" if mode & 0o6000 else "SCMP_ACT_ALLOW"
        assert decisions(profile, name, args) == {expected}, (name, oct(mode))


@pytest.mark.parametrize("name", sorted(C.OPEN_ARGS))
def test_opening_refuses_only_making_a_file_with_a_setid_mode(name: str):
    profile = C.extend_profile(DEFAULT)
    flags_arg, mode_arg = C.OPEN_ARGS[name]
    for flags, mode in itertools.product((0, 0o2, O_CREAT | 0o1, O_TMPFILE_BIT | 0o200000, O_CREAT | O_TMPFILE_BIT,
                                          (1 << 33) | 0o2),
                                         (0, 0o644, 0o4755, 0o2700, 0o6777)):
        args = [0, 0, 0, 0, 0, 0]
        args[flags_arg], args[mode_arg] = flags, mode
        made = flags & (O_CREAT | O_TMPFILE_BIT)
        expected = "SCMP_ACT_ERRNO:1" if made and mode & 0o6000 else "SCMP_ACT_ALLOW"
        assert decisions(profile, name, args) == {expected}, (name, oct(flags), oct(mode))


def test_the_installed_default_profile_extends():
    path = C.default_profile_path()
    if path is None:
        pytest.skip("no engine's default seccomp profile here (containers-common)")
    with open(path) as f:
        profile = C.extend_profile(json.load(f))
    assert decisions(profile, "chmod", [0, 0o4755]) == {"SCMP_ACT_ERRNO:1"}
    assert decisions(profile, "chmod", [0, 0o755]) == {"SCMP_ACT_ALLOW"}
    assert os.path.basename(path) == "seccomp.json"


@pytest.mark.parametrize("name", C.KEYRING_CALLS)
def test_the_kernel_keyrings_are_refused_whatever_the_default_allowed(name: str):
    """containers-common's profile allows keyctl, and the keyrings are not namespaced: a rootful container
    reached the host root's user keyring (tests/security/test_container_keyring.py)."""
    assert decisions(C.extend_profile(DEFAULT), name, [0] * 6) == {"SCMP_ACT_ERRNO:1"}
    path = C.default_profile_path()
    if path is not None:
        with open(path) as f:
            assert decisions(C.extend_profile(json.load(f)), name, [0, -4 & (2**64 - 1), 0, 0, 0, 0]) == {
                "SCMP_ACT_ERRNO:1"}


def test_something_else_is_refused():
    with pytest.raises(ValueError, match="not a seccomp profile"):
        C.extend_profile({"syscalls": "nope"})
