"""Work counted in steps, not seconds: the lines of a module's Python that run for one call. The count is
the same on a loaded machine as on an idle one, where a bound in seconds fails under load; the seconds
themselves are measured in benchmarks/."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType, ModuleType
from typing import Any


def lines_run(module: ModuleType, call: Callable[..., Any], *args: Any) -> int:
    """How many lines of `module`'s own source run while `call(*args)` does, in this thread."""
    source = module.__file__
    count = 0

    def in_module(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
        return in_module

    def on_call(frame: FrameType, event: str, arg: Any) -> Any:
        return in_module if frame.f_code.co_filename == source else None

    before = sys.gettrace()
    sys.settrace(on_call)
    try:
        call(*args)
    finally:
        sys.settrace(before)
    return count
