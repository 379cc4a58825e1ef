"""The key a kernel finds its sandbox by, where a gateway starts it: a restart must find the same box.

Enterprise Gateway's launchers name the connection file `kernel-<id>_<random>.json` (a new random
part at every start, restart included) and put the kernel's id in KERNEL_ID; the key must come from
the id, never from the random part. KERNEL_ID is inherited by whatever starts under a gateway's
kernel, so it names the key only where there is no connection file.
"""

from __future__ import annotations

import re
import tempfile

import pytest

from owsandbox.terminal import locate

pytestmark = pytest.mark.unit

KERNEL_ID = "3f0c8a52-5b1e-4d8f-9a51-2b7c1f0e9d44"


def mkstemp_name(prefix: str) -> str:
    """A name as the gateway's launcher makes it: tempfile's own random part (the name only, no file)."""
    return prefix + next(tempfile._get_candidate_names()) + ".json"  # what mkstemp(prefix=...) draws


def test_the_gateways_random_part_is_dropped_from_the_connection_files_name() -> None:
    first = mkstemp_name(f"/tmp/kernel-{KERNEL_ID}_")
    second = mkstemp_name(f"/tmp/kernel-{KERNEL_ID}_")
    assert locate.sandbox_key(first) == locate.sandbox_key(second) == f"kernel-{KERNEL_ID}"


def test_a_name_that_only_looks_like_the_gateways_keeps_its_whole_stem() -> None:
    # not a uuid before the underscore, or not eight characters after it: nothing is dropped
    assert locate.sandbox_key("/r/kernel-lab_abcdefgh.json") == "kernel-lab_abcdefgh"
    assert locate.sandbox_key(f"/r/kernel-{KERNEL_ID}_abc.json") == f"kernel-{KERNEL_ID}_abc"
    assert locate.sandbox_key(f"/r/kernel-{KERNEL_ID}.json") == f"kernel-{KERNEL_ID}"


def test_the_connection_file_decides_and_an_inherited_kernel_id_is_not_followed() -> None:
    env = {"KERNEL_ID": KERNEL_ID}
    assert locate.kernel_key(mkstemp_name(f"/tmp/kernel-{KERNEL_ID}_"), env) == f"kernel-{KERNEL_ID}"
    # two kernels started by papermill under one gateway kernel: temporary files, one inherited KERNEL_ID
    first, second = locate.kernel_key("/tmp/tmpx1y2.json", env), locate.kernel_key("/tmp/tmpz3w4.json", env)
    assert first != second and first.startswith("kernel-file-")
    assert locate.kernel_key("", env) == f"kernel-{KERNEL_ID}"  # no file: the id is all there is


def test_without_kernel_id_the_connection_file_decides() -> None:
    assert locate.kernel_key(f"/run/kernel-{KERNEL_ID}.json", {}) == f"kernel-{KERNEL_ID}"
    assert re.fullmatch(r"kernel-file-[0-9a-f]{20}", locate.kernel_key("/tmp/tmpx1y2.json", {"KERNEL_ID": ""}))


@pytest.mark.parametrize("bad", ["../other", "a/b", "-rf", "x" * 129, "id with space", ".hidden", ""])
def test_a_kernel_id_that_cannot_name_a_folder_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="KERNEL_ID") as caught:
        locate.kernel_key("", {"KERNEL_ID": bad})
    assert repr(bad) in str(caught.value)
    assert locate.kernel_key("/tmp/kernel-x.json", {"KERNEL_ID": bad}) == "kernel-x"  # not used: not refused

