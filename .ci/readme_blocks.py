"""Print one of README.md's command blocks, for .ci/run and the tests to run.

A command block is the ```bash fence right after ``<!-- command: NAME -->``; the
README's install, main-job and tests commands are such blocks, so what CI runs is
what the README says, as written. ``--without-index-url`` drops each pip
``--index-url URL``: for a machine that cannot reach PyTorch's CPU index (the one
allowed departure from the README).

Usage: python .ci/readme_blocks.py NAME [--without-index-url]
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def block(name: str, text: str | None = None) -> str:
    """The commands of the block called `name` in the README (or in `text`)."""
    text = README.read_text(encoding="utf-8") if text is None else text
    pattern = rf"<!-- command: {re.escape(name)} -->\n```bash\n(.*?)```"
    found = re.findall(pattern, text, re.S)
    if len(found) != 1:
        raise SystemExit(
            f"{README.name}: {len(found)} command blocks named {name!r}, not one"
            f" (a ```bash fence after <!-- command: {name} -->)"
        )
    return str(found[0])


def without_index_url(commands: str) -> str:
    """`commands` with every `--index-url URL` (or `--index-url=URL`) left out."""
    return re.sub(r"[ \t]+--index-url(?:=|[ \t]+)\S+", "", commands)


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-") or set(argv[1:]) - {"--without-index-url"}:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    commands = block(argv[0])
    if "--without-index-url" in argv[1:]:
        commands = without_index_url(commands)
    print(commands, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
