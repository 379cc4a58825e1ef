"""`python -m owsandbox.box serve|attach ...`."""

import sys

from .cli import main

sys.exit(main())
