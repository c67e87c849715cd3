"""Drop the files the answers did not ask for, or that could not work."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ADD_GITHUB_ACTIONS = {{cookiecutter.add_github_actions | tojson}}
PYTEST_MPS_ORIGIN = {{cookiecutter.__pytest_mps_origin | tojson}}
CI_NOTE = {{cookiecutter.__pytest_mps_ci_note | tojson}}


def main() -> None:
    """Keep the GitHub Actions workflow only if it was wanted and can install;
    say where the project is."""
    wanted = ADD_GITHUB_ACTIONS == "y"
    if wanted and CI_NOTE:
        print(CI_NOTE, file=sys.stderr)
    # A CI machine has no copy of a path on this one: the install step would fail.
    if not wanted or PYTEST_MPS_ORIGIN == "path":
        shutil.rmtree(Path.cwd() / ".github")
    # cookiecutter says nothing of where the project went
    print(f"baked {Path.cwd().name} into {Path.cwd()}: README.md there says what next")


if __name__ == "__main__":
    main()
