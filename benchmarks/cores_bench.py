"""The seconds of the pure cores whose unit tests count steps instead (a bound in seconds fails on a
loaded machine): the kernel's is_complete checker on 10,000 lines, on a typical cell and on inputs made
to be slow, and the Markdown and HTML the kernel makes safe from files made to be slow to make safe.

The unit tests (tests/test_kernel_completeness.py, tests/security/test_untrusted_output.py) bound the
lines of Python each call runs per character; this prints the median time of each call, and the lines
per character beside it.

Run: `python benchmarks/cores_bench.py [--rounds R]` from the repository root.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from owsandbox.kernel.display import untrusted
from owsandbox.kernel.editing import completeness
from tests.steps import lines_run  # noqa: E402

TEN_THOUSAND_LINES = "\n".join(f"echo line {i} | grep -v x > /dev/null; x=$((i + 1))" for i in range(10_000))
TYPICAL = "for f in *.txt; do\n    if [[ -f $f ]]; then\n        wc -l \"$f\"\n    fi\ndone"
PATHOLOGICAL = ["$( ((" * 5000, "$((" * 5000, "((" * 5000, "$(" * 20000, "{ " * 20000, "'" * 100001, "\\" * 100001,
                "a[" * 20000, "x@(a)" * 5000, "cat <<EOF\n" + "x\n" * 100_000 + "EOF"]
SLOW_PIECES = ["<img ", "<pre", "\\", "<", "` `` ", "](", "](&", "```\n", "    x\n\n", "\\" * 50 + "<", "`" * 3 + "x"]


def median_seconds(rounds: int, call: Callable[..., Any], *args: Any) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        call(*args)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def safe_text(text: str) -> None:
    untrusted.markdown_text(text)
    untrusted.html_frame(text, "slow")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    check = completeness.check
    typical = median_seconds(max(args.rounds, 1000), check, TYPICAL)
    print(f"checker, a typical cell: {typical * 1e6:.0f} µs median, "
          f"{lines_run(completeness, check, TYPICAL) / len(TYPICAL):.1f} lines per character")
    cases = [("10,000 lines", TEN_THOUSAND_LINES)] + [(repr(code[:12]) + f"… ({len(code)} characters)", code)
                                                       for code in PATHOLOGICAL]
    for name, code in cases:
        seconds = median_seconds(args.rounds, check, code)
        print(f"checker, {name}: {seconds * 1000:.0f} ms median, "
              f"{lines_run(completeness, check, code) / len(code):.1f} lines per character")
    for piece in SLOW_PIECES:
        text = piece * (400_000 // len(piece))
        seconds = median_seconds(args.rounds, safe_text, text)
        steps = lines_run(untrusted, untrusted.markdown_text, text) + lines_run(untrusted, untrusted.html_frame,
                                                                                 text, "slow")
        print(f"untrusted Markdown and HTML, {piece[:12]!r} × {400_000 // len(piece)}: {seconds * 1000:.0f} ms median, "
              f"{steps / len(text):.1f} lines per character")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
