"""Sphinx configuration of pytest-mps's documentation (MyST Markdown pages).

Sphinx, as pytest, pytest-xdist and pytest-benchmark build theirs: the pytest
ecosystem reads it on Read the Docs, and MyST lets the pages stay Markdown that
GitHub renders too. CI builds it with warnings as errors:
``sphinx-build -W -b html docs docs/_build``.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "pytest-mps"
author = "the pytest-mps developers"
copyright = "2026, the pytest-mps developers"
extensions = ["myst_parser", "mps_reference"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "examples"]
# furo, as pip and attrs use: code blocks scroll instead of being cut at a
# fixed column, and the sidebar wraps long option names
html_theme = "furo"
html_title = "pytest-mps"
# Help texts are shown as written: no "--" turned into an en dash, no curly
# quotes in option names and code-like text.
smartquotes = False
myst_heading_anchors = 3
