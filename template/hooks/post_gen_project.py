"""Drop the files the answers did not ask for."""

from __future__ import annotations

import shutil
from pathlib import Path

ADD_GITHUB_ACTIONS = {{cookiecutter.add_github_actions | tojson}}


def main() -> None:
    """Remove the GitHub Actions workflow unless it was wanted."""
    if ADD_GITHUB_ACTIONS != "y":
        shutil.rmtree(Path.cwd() / ".github")


if __name__ == "__main__":
    main()
