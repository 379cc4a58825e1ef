"""Small servers a test starts inside a sandbox, for `%preview` (tests/test_preview.py, benchmarks/preview.py):
standard library only, as the box runs the host's Python without the test environment's packages."""

from pathlib import Path

FOLDER = Path(__file__).parent
HEADERS_ECHO = FOLDER / "headers_echo.py"
WS_ECHO = FOLDER / "ws_echo.py"
