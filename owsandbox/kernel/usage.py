"""The sandbox's usage, in the shape of ipykernel's `usage_reply`, for JupyterLab's Kernel Usage panel.

ipykernel answers `usage_request` with the kernel process and its children; a sandboxed kernel's work
is in the box (a detached daemon, a container, a remote machine), so that answer shows a kernel idling.
Here the reply keeps ipykernel's fields with the box's figures: `kernel_memory` is the box's memory,
`kernel_cpu` its CPU use since the last request (percent of one CPU), and the "host" fields are the
box's limits (`host_virtual_memory.total` is its memory limit, `cpu_count` its CPUs), so the panel's
bars fill up against what the box may use. `sandbox` has the rest. Pure: fed the box's figures.
"""

from __future__ import annotations

import math
import os
import socket
from typing import Any


def _machine_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


class UsageMeter:
    """Turns the box's successive `box.usage` figures into replies; remembers the last for CPU percent."""

    def __init__(self) -> None:
        self._last: tuple[float, float] | None = None  # (when, cpu_seconds)

    def reply(self, figures: dict[str, Any], now: float, provider: str, memory_limit: int | None,
              cpu_limit: float | None) -> dict[str, Any]:
        used = _count(figures.get("memory_bytes"))
        said = figures.get("cpu_seconds")
        cpu_seconds = float(said) if isinstance(said, (int, float)) and math.isfinite(said) and said >= 0 else 0.0
        percent = 0.0
        if self._last is not None and now > self._last[0]:
            percent = max(0.0, (cpu_seconds - self._last[1]) / (now - self._last[0]) * 100)
        self._last = (now, cpu_seconds)
        cpus = cpu_limit if cpu_limit else max(1, _count(figures.get("cpus")) or 1)
        total = memory_limit or _machine_memory() or used
        return {
            "hostname": socket.gethostname(), "pid": os.getpid(),
            "kernel_cpu": round(percent, 1), "kernel_memory": used,
            "host_cpu_percent": round(percent / cpus, 1), "cpu_count": max(1, math.ceil(cpus)),
            "host_virtual_memory": {"total": total, "available": max(total - used, 0), "used": used,
                                    "free": max(total - used, 0),
                                    "percent": round(100 * used / total, 1) if total else 0.0},
            "sandbox": {"provider": provider, "memory_bytes": used, "memory_limit": memory_limit,
                        "cpu_seconds": cpu_seconds, "cpu_limit": cpu_limit,
                        "processes": _count(figures.get("processes"))},
        }


def _count(value: Any) -> int:
    """A count from the box: a whole number of at least 0 (anything else is 0; the box's word is shown only)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 62 else 0


def cell_usage(said: Any) -> dict[str, Any] | None:
    """A command's figures from the box (`RunResult.usage`, box/shell/cellusage.py) as the execute_reply's
    `metadata["owsandbox"]["usage"]`: `peak_memory_bytes` (int) and `cpu_seconds` (float, or None where the
    box could not count it). None when the box said nothing usable: the metadata then has no figures
    rather than made-up ones."""
    if not isinstance(said, dict):
        return None
    peak = said.get("peak_memory_bytes")
    if not isinstance(peak, int) or isinstance(peak, bool) or not 0 <= peak < 1 << 62:
        return None
    cpu = said.get("cpu_seconds")
    cpu_seconds = (float(cpu) if isinstance(cpu, (int, float)) and not isinstance(cpu, bool)
                   and math.isfinite(cpu) and 0 <= cpu < 1e12 else None)
    return {"peak_memory_bytes": peak, "cpu_seconds": cpu_seconds}
