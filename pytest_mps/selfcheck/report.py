"""The self-check's report: one record per item, written as Markdown and JSON.

Each :class:`Item` has a ``name``, what pytest-mps ``expected``, what this
machine ``observed`` (both one line of text), a ``verdict`` (``agrees``,
``differs``, ``not run`` with the reason in ``observed``, or ``error``) and
``details`` (a mapping of the raw values read, JSON types only). The JSON
file is ``{"pytest_mps": version, "machine": {...}, "items": [...]}``; the
Markdown file is a header, the machine's facts and one table row per item,
then each item's details. Both are written atomically (a temporary file, then
``os.replace``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pytest_mps.report import write_text_atomically

VERDICTS = ("agrees", "differs", "not run", "error")


@dataclass
class Item:
    """One check: what was expected, what this machine did."""

    name: str
    expected: str
    observed: str
    verdict: str
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"{self.name}: verdict {self.verdict!r} not in {VERDICTS}")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(version: str, machine: dict[str, Any], items: list[Item]) -> str:
    """The report as Markdown: paste it into an issue."""
    counts = {v: sum(1 for i in items if i.verdict == v) for v in VERDICTS}
    lines = [
        f"# pytest-mps self-check ({version})",
        "",
        ", ".join(f"{n} {v}" for v, n in counts.items()),
        "",
        "| machine | |",
        "| --- | --- |",
        *(f"| {k} | {_cell(str(v))} |" for k, v in machine.items()),
        "",
        "| item | expected | observed | verdict |",
        "| --- | --- | --- | --- |",
        *(
            f"| {i.name} | {_cell(i.expected)} | {_cell(i.observed)} | {i.verdict} |"
            for i in items
        ),
        "",
    ]
    for item in items:
        if item.details:
            lines += [f"## {item.name}", "", "```json"]
            lines += [json.dumps(item.details, indent=2, default=str), "```", ""]
    return "\n".join(lines)


def write(
    folder: Path, version: str, machine: dict[str, Any], items: list[Item]
) -> tuple[Path, Path]:
    """Write ``selfcheck.md`` and ``selfcheck.json`` in ``folder``; their paths."""
    data = {
        "pytest_mps": version,
        "machine": machine,
        "items": [asdict(i) for i in items],
    }
    md, js = folder / "selfcheck.md", folder / "selfcheck.json"
    write_text_atomically(js, json.dumps(data, indent=2, default=str) + "\n")
    write_text_atomically(md, markdown(version, machine, items))
    return md, js
