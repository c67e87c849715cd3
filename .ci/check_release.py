"""Check built distributions before they are published, past what twine checks.

``twine check --strict`` (run before this) checks that the metadata parses and the
README renders. A release also needs:

- one wheel and one sdist, of one version, which is the tag's (``v0.1.0``);
- the metadata a package index shows: a summary, the licence (an SPDX expression
  and its file), classifiers, ``Requires-Python``, a Markdown readme, and the
  project's URLs (``Homepage``, ``Source``, ``Issues``);
- in GitHub Actions, a ``Source`` URL that is the repository being released;
- a readme (the long description) fit for PyPI, which shows it without the
  repository's files: no "not on PyPI yet" left in it, and no relative link or
  image (``docs/benchmarks.md``), each of which is named.

The URLs are left out of pyproject.toml until the repository's public address is
known; without them this check fails and prints the lines to add (with the
address read from GitHub Actions' environment when it runs there).

Usage: python .ci/check_release.py DIST_DIR [--tag vX.Y.Z]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tarfile
import zipfile
from email.message import Message
from email.parser import HeaderParser
from pathlib import Path

URLS = ("Homepage", "Source", "Issues")
SINGLE = ("Summary", "License-Expression", "Requires-Python")
UNRELEASED = re.compile(r"not\s+on\s+PyPI\s+yet", re.I)
# Code, where a link is only text: fenced blocks, then inline spans.
CODE = re.compile(r"^(```|~~~).*?^\1[^\n]*$|`[^`\n]*`", re.M | re.S)
TARGETS = (
    re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)"),  # [text](target), ![alt](src)
    re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?([^\s>]+)", re.M),  # [label]: target
    re.compile(r"""<(?:img|a|source)\b[^>]*?\b(?:src|href)\s*=\s*["']([^"']+)""", re.I),
)
# A scheme (https:, mailto:), a page anchor or a protocol-relative URL.
ABSOLUTE = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*:|#|//")


def read_metadata(dist: Path) -> Message:
    """The core metadata of a wheel (METADATA) or an sdist (PKG-INFO)."""
    if dist.suffix == ".whl":
        with zipfile.ZipFile(dist) as archive:
            name = next(
                n for n in archive.namelist() if n.endswith(".dist-info/METADATA")
            )
            text = archive.read(name).decode()
    else:
        with tarfile.open(dist) as archive:
            member = next(m for m in archive.getmembers() if m.name.count("/") == 1
                          and m.name.endswith("/PKG-INFO"))  # fmt: skip
            handle = archive.extractfile(member)
            assert handle is not None
            text = handle.read().decode()
    return HeaderParser().parsestr(text)


def project_urls(metadata: Message) -> dict[str, str]:
    """Project-URL entries by label: {'Source': 'https://...'}."""
    urls = {}
    for entry in metadata.get_all("Project-URL") or []:
        label, _, url = entry.partition(",")
        urls[label.strip()] = url.strip()
    return urls


def repository_url(environ: dict[str, str]) -> str | None:
    """The address of the repository a GitHub Actions run releases, if any."""
    server, repository = (
        environ.get("GITHUB_SERVER_URL"),
        environ.get("GITHUB_REPOSITORY"),
    )
    return f"{server}/{repository}" if server and repository else None


def readme_problems(readme: str) -> list[str]:
    """What in the readme would be wrong on PyPI, one message per kind."""
    found = []
    if UNRELEASED.search(readme):
        found.append(
            "the readme says pytest-mps is not on PyPI yet: update its Install"
            " section for the release"
        )
    text = CODE.sub("", readme)
    relative = [
        target
        for pattern in TARGETS
        for target in pattern.findall(text)
        if not ABSOLUTE.match(target)
    ]
    if relative:
        found.append(
            "the readme links to files PyPI does not have:"
            f" {', '.join(dict.fromkeys(relative))}; make these links and images"
            " absolute (https://github.com/OWNER/REPO/blob/vX.Y.Z/...)"
        )
    return found


def problems(metadata: Message, tag: str | None, environ: dict[str, str]) -> list[str]:
    """What keeps this metadata from being released, one message per problem."""
    found = [f"no {field}" for field in SINGLE if not metadata.get(field)]
    if not metadata.get_all("License-File"):
        found.append("no License-File: the licence text is not in the package")
    if not metadata.get_all("Classifier"):
        found.append("no Classifier")
    if metadata.get("Description-Content-Type") != "text/markdown":
        found.append("the readme is not declared as text/markdown")
    found += readme_problems(str(metadata.get_payload()))
    version = metadata.get("Version")
    if tag is not None and tag != f"v{version}":
        found.append(f"tag {tag!r} is not v{version}, the version built")
    urls = project_urls(metadata)
    repository = repository_url(environ)
    missing = [label for label in URLS if label not in urls]
    if missing:
        base = repository or "https://github.com/OWNER/REPO"
        lines = {"Homepage": base, "Source": base, "Issues": f"{base}/issues"}
        add = "".join(f'\n    {label} = "{lines[label]}"' for label in missing)
        found.append(
            f"no project URL for {', '.join(missing)}: add to pyproject.toml's"
            f" [project.urls]:{add}"
        )
    if (
        repository
        and "Source" in urls
        and urls["Source"].rstrip("/")
        not in (
            repository,
            f"{repository}.git",
        )
    ):
        found.append(
            f"Source is {urls['Source']}, but this release is built from {repository}"
        )
    return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("dist_dir", type=Path)
    parser.add_argument("--tag", help="the release's git tag, vX.Y.Z")
    args = parser.parse_args(argv)
    dists = sorted(args.dist_dir.glob("*.whl")) + sorted(args.dist_dir.glob("*.tar.gz"))
    kinds = sorted(d.suffix for d in dists)
    if kinds != [".gz", ".whl"]:
        print(f"{args.dist_dir}: expected one wheel and one sdist, found"
              f" {[d.name for d in dists]}", file=sys.stderr)  # fmt: skip
        return 1
    metadata = {dist: read_metadata(dist) for dist in dists}
    versions = {m.get("Version") for m in metadata.values()}
    failed = len(versions) != 1
    if failed:
        print(f"the wheel and the sdist differ in version: {versions}", file=sys.stderr)
    # One line per problem, naming the files it is in (most are in both).
    where: dict[str, list[str]] = {}
    for dist, meta in metadata.items():
        for problem in problems(meta, args.tag, dict(os.environ)):
            where.setdefault(problem, []).append(dist.name)
    for problem, names in where.items():
        print(f"{' and '.join(names)}: {problem}", file=sys.stderr)
    failed = failed or bool(where)
    if not failed:
        print(f"ready to publish: {', '.join(d.name for d in dists)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
