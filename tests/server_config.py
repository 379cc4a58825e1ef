"""The Jupyter servers the tests start go without nbgrader, which this environment has as test tooling.

Every Jupyter server loads the server extensions its environment enables, and nbgrader's four cost a
start over a second of CPU (they import its database and exchange layers); its lab extension adds to
every page JupyterLab loads. A person's JupyterLab has neither (the `lab` extra), so a test's server
turns them off in its own config folder, where the test environment's enabling is overridden.
"""

from __future__ import annotations

import json
from pathlib import Path

NBGRADER_SERVER_EXTENSIONS = tuple(f"nbgrader.server_extensions.{name}"
                                   for name in ("formgrader", "validate_assignment", "assignment_list", "course_list"))
NBGRADER_LAB_EXTENSION = "@jupyter/nbgrader"


def without_nbgrader(config: Path) -> None:
    """Turn nbgrader's server and lab extensions off for a server whose JUPYTER_CONFIG_DIR is `config`."""
    config.mkdir(parents=True, exist_ok=True)
    (config / "jupyter_server_config.json").write_text(json.dumps(
        {"ServerApp": {"jpserver_extensions": dict.fromkeys(NBGRADER_SERVER_EXTENSIONS, False)}}))
    (config / "labconfig").mkdir(exist_ok=True)
    (config / "labconfig" / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {NBGRADER_LAB_EXTENSION: True}}))
