"""How many examples a property test tries.

A whole run gives every property its full budget; the fast tier (`pytest -m unit`, which a developer
runs between edits and which must stay under a minute) gives each a third of it, never fewer than
30. The scale is set once by tests/conftest.py before any test module is imported, so a decorator's
`max_examples=examples(300)` reads it when the module is collected.
"""

from __future__ import annotations

FAST_TIER_SCALE = 1 / 3
FEWEST = 30

scale = 1.0


def examples(full: int) -> int:
    """The number of examples for a property whose full budget is `full`."""
    return max(min(full, FEWEST), round(full * scale))
