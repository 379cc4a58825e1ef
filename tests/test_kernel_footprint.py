"""The kernel gives back what its start freed (kernel/footprint.py): glibc's malloc_trim where there is
glibc, nothing (and no error) where there is not."""

from __future__ import annotations

import ctypes

import pytest

from owsandbox.kernel.footprint import give_back_freed_memory

pytestmark = pytest.mark.unit


def test_glibc_is_asked_to_give_back_its_free_pages():
    trimmed: list[int] = []

    class Libc:
        def malloc_trim(self, pad: int) -> int:
            trimmed.append(pad)
            return 1

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(ctypes, "CDLL", lambda _name: Libc())
        assert give_back_freed_memory() is True
    assert trimmed == [0]


def test_this_machines_c_library_answers_it():
    assert give_back_freed_memory() is (hasattr(ctypes.CDLL(None), "malloc_trim"))


@pytest.mark.parametrize("failure", [OSError("no libc"), AttributeError("malloc_trim")])
def test_without_glibc_nothing_is_done(failure):
    def refuse(_name: object) -> object:
        raise failure

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(ctypes, "CDLL", refuse)
        assert give_back_freed_memory() is False
