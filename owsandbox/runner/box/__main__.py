"""`python -m owsandbox.runner.box serve|attach ...`."""

import sys

from .cli import main

sys.exit(main())
