"""Print the oldest release of a dependency pyproject.toml allows, as pip pins it.

Usage: python .ci/torch_floor.py [PACKAGE]   # torch (2.6.0); pytest, pluggy too
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def floor(text: str, package: str = "torch") -> str:
    """The ``"package>=X.Y`` bound in ``text`` (a pyproject.toml), as ``X.Y.0``."""
    pattern = rf"""^\s*["']{re.escape(package)}\s*>=\s*([\d.]+)"""
    found = re.search(pattern, text, re.M)
    if found is None:
        raise SystemExit(f"{PYPROJECT.name}: no {package}>=X.Y among the dependencies")
    parts = found[1].split(".")
    return ".".join(parts + ["0"] * (3 - len(parts)))


if __name__ == "__main__":
    package = sys.argv[1] if len(sys.argv) > 1 else "torch"
    print(floor(PYPROJECT.read_text(encoding="utf-8"), package))
    sys.exit(0)
