"""The reference of pytest-mps's options and ini keys, read from their definitions.

``collect()`` loads pytest's plugins as a run does (pytest-mps through its
``pytest11`` entry point) and reads every ``--mps*`` option and ``mps_*`` ini
key from the parser they were added to, with their help texts; the directive
``{mps-reference}`` writes them into the page, so the page cannot drift from
the code. tests/test_docs.py compares the same lists with ``pytest --help``.
"""

from __future__ import annotations

import argparse
from typing import Any


def collect() -> tuple[list[tuple[list[str], str]], list[tuple[str, str, str]]]:
    """([option spellings], help) per option; (ini key, type, help) per key."""
    from _pytest.config import _prepareconfig

    # what pytest does before --help prints: plugins loaded, options added
    config = _prepareconfig(["-p", "no:cacheprovider"])
    parser = config._parser
    options: list[tuple[list[str], str]] = []
    for group in (parser._anonymous, *parser._groups):
        for option in group.options:
            names = option.names()
            text = str(option.attrs().get("help", ""))
            if text == argparse.SUPPRESS:  # hidden spellings (--mps-audit=error)
                continue
            if any(name.startswith("--mps") for name in names):
                options.append((list(names), text))
    keys = [
        (name, str(kind or "string"), str(text))
        for name, (text, kind, _) in parser._inidict.items()
        if name.startswith("mps_")
    ]
    return sorted(options), sorted(keys)


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown() -> str:
    """The reference as Markdown tables."""
    options, keys = collect()
    lines = ["## Command-line options", "", "| option | what it does |", "|---|---|"]
    for names, text in options:
        spelled = ", ".join(f"`{name}`" for name in names)
        lines.append(f"| {spelled} | {_escape(text)} |")
    lines += ["", "## ini keys", "", "| key | type | what it does |", "|---|---|---|"]
    for name, kind, text in keys:
        lines.append(f"| `{name}` | {kind} | {_escape(text)} |")
    return "\n".join(lines) + "\n"


def setup(app: Any) -> dict[str, Any]:
    """Sphinx: replace the ``{mps-reference}`` marker of reference.md when read."""

    def fill(app: Any, docname: str, source: list[str]) -> None:
        if docname == "reference":
            source[0] = source[0].replace("<!-- mps-reference -->", markdown())

    app.connect("source-read", fill)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
