"""Sphinx configuration: MyST Markdown pages, the PyData theme, and `owsandbox_reference`, the extension
that writes the reference of magics, commands and settings from the code's own tables at build time."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))
sys.path.insert(0, str(HERE.parent))  # the package itself, for a build from a checkout

project = "owsandbox"
author = "the owsandbox authors"
copyright = "the owsandbox authors"  # noqa: A001 (Sphinx's name)

extensions = ["myst_parser", "owsandbox_reference"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
root_doc = "index"

myst_heading_anchors = 3  # `page.md#a-heading` links, as GitHub makes them
smartquotes = False  # `--help` text keeps its `--` and quotes as the program prints them

html_theme = "pydata_sphinx_theme"
html_title = "owsandbox"
html_static_path = ["_static"]
html_theme_options = {"navigation_with_keys": False, "show_toc_level": 2,
                      "footer_start": ["copyright"], "footer_end": []}
html_show_sourcelink = False
