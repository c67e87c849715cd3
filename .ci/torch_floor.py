"""Print the oldest torch release pyproject.toml allows, as pip pins it (2.6.0).

Usage: python .ci/torch_floor.py
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def floor(text: str) -> str:
    """The ``"torch>=X.Y`` lower bound in ``text`` (a pyproject.toml), as ``X.Y.0``."""
    found = re.search(r"""^\s*["']torch\s*>=\s*([\d.]+)""", text, re.M)
    if found is None:
        raise SystemExit(f"{PYPROJECT.name}: no torch>=X.Y among the dependencies")
    parts = found[1].split(".")
    return ".".join(parts + ["0"] * (3 - len(parts)))


if __name__ == "__main__":
    print(floor(PYPROJECT.read_text(encoding="utf-8")))
    sys.exit(0)
