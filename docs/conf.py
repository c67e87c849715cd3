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
extensions = ["myst_parser", "mps_reference"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "examples"]
html_theme = "alabaster"
myst_heading_anchors = 3
