"""`python -m owsandbox.terminal` is `owsandbox shell` (for a server that starts it with its own Python)."""

import sys

from .cli import main

sys.exit(main())
