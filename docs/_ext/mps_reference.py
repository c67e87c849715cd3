"""The reference of pytest-mps's options, ini keys, markers and fixtures.

``collect()`` loads pytest's plugins as a run does (pytest-mps through its
``pytest11`` entry point) and reads every ``--mps*`` option and ``mps_*`` ini
key from the parser they were added to, with their help texts;
``markers()`` the markers pytest-mps registers (a configured session's
``markers`` lines, less those of a session without pytest-mps);
``fixtures()`` the fixtures its modules define, with their docstrings. The
marker ``<!-- mps-reference -->`` of reference.md is replaced with them when
the page is read, so the page cannot drift from the code. Each text is shown
as written: every Markdown character in it is escaped, and ``%%`` (argparse's
escape) reads ``%``. tests/test_docs.py compares the lists with ``pytest
--help`` and reads the built page.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
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
                # argparse formats option help with %: "%%" is one "%"
                options.append((list(names), text.replace("%%", "%")))
    keys = [
        (name, str(kind or "string"), str(text))
        for name, (text, kind, _) in parser._inidict.items()
        if name.startswith("mps_")
    ]
    return sorted(options), sorted(keys)


def markers() -> list[tuple[str, str]]:
    """(signature, text) of each marker pytest-mps registers."""
    from _pytest.config import _prepareconfig

    def lines(*args: str) -> list[str]:
        config = _prepareconfig(["-p", "no:cacheprovider", *args])
        config._do_configure()
        try:
            return [str(line) for line in config.getini("markers")]
        finally:
            config._ensure_unconfigure()

    without = set(lines("-p", "no:mps"))
    # the pytest-benchmark alias's marker is registered under --mps-benchmark-alias
    found = [line for line in lines("--mps-benchmark-alias") if line not in without]
    pairs = []
    for line in found:
        signature, _, text = line.partition(": ")
        pairs.append((signature.strip(), text.strip()))
    return sorted(pairs)


def fixtures() -> list[tuple[str, str, str]]:
    """(name, scope and what it gives, first docstring line) of each fixture."""
    from pytest_mps import plugin

    modules = [plugin.STARTUP, "pytest_mps.benchmark.alias"]
    found = {}
    for module_name in modules:
        module = importlib.import_module(module_name)
        for name, value in vars(module).items():
            marker = getattr(value, "_fixture_function_marker", None)
            if marker is None:
                continue
            function = value._get_wrapped_function()
            returns = inspect.signature(function).return_annotation
            if returns is inspect.Signature.empty:
                returns = "None"
            returns = re.sub(
                r"^Generator\[(.*?)(, None, None)?\]$", r"\1", str(returns)
            )
            doc = inspect.getdoc(function) or ""
            first = " ".join(doc.split("\n\n", 1)[0].split())
            found[marker.name or name] = (
                f"{marker.scope} scope, gives {returns}",
                first,
            )
    return [(name, *found[name]) for name in sorted(found)]


_MARKDOWN = re.compile(r"([!-/:-@\[-`{-~])")


def _escape(text: str) -> str:
    """The text as written: every ASCII punctuation backslash-escaped (CommonMark)."""
    return _MARKDOWN.sub(r"\\\1", " ".join(text.split()))


def _docstring(text: str) -> str:
    """A docstring's line: its ``literal`` spans as code, the rest as written."""
    parts = re.split(r"``(.+?)``", text)
    return "".join(
        f"`{part}`" if index % 2 else _escape(part) for index, part in enumerate(parts)
    )


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
    lines += ["", "## Markers", "", "| marker | what it does |", "|---|---|"]
    for signature, text in markers():
        lines.append(f"| `@pytest.mark.{signature}` | {_escape(text)} |")
    lines += ["", "## Fixtures", "", "| fixture | scope, gives | what it is |"]
    lines.append("|---|---|---|")
    for name, gives, text in fixtures():
        lines.append(f"| `{name}` | {_escape(gives)} | {_docstring(text)} |")
    return "\n".join(lines) + "\n"


def setup(app: Any) -> dict[str, Any]:
    """Sphinx: replace the ``{mps-reference}`` marker of reference.md when read."""

    def fill(app: Any, docname: str, source: list[str]) -> None:
        if docname == "reference":
            source[0] = source[0].replace("<!-- mps-reference -->", markdown())

    app.connect("source-read", fill)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
