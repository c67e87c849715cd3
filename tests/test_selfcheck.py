"""``python -m pytest_mps.selfcheck``: every Mac-only path run here, one report.

On Linux the Mac reads say "not run" with the reason and the device checks
run on the emulated device; the report lists every item with what was
expected and what was observed, in Markdown and JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_mps.selfcheck import corpus
from pytest_mps.selfcheck.report import VERDICTS, Item, markdown


def test_the_selfcheck_writes_a_complete_report(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest_mps.selfcheck", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "pytest-mps selfcheck: wrote" in done.stdout
    data = json.loads((tmp_path / "selfcheck.json").read_text())
    items = data["items"]
    names = [item["name"] for item in items]
    assert len(names) == 7 + len(corpus.CASES)
    for item in items:  # every item says what was expected and what happened
        assert item["expected"] and item["observed"], item
        assert item["verdict"] in VERDICTS
    verdicts = {item["name"]: item["verdict"] for item in items}
    if sys.platform != "darwin":
        assert verdicts["macOS version"] == "not run"
        assert verdicts["GPU facts, both ways"] == "not run"
        # what runs here through the emulated device (and a child on the CPU)
        for name in (
            "the probe",
            "isolation: fork server and spawn",
            "cache emptying with cycles (emulated mps)",
            "the shutdown watchdog",
        ):
            assert verdicts[name] == "agrees", [i for i in items if i["name"] == name]
        emulated = {i["name"]: i["expected"] for i in items}
        assert emulated["corpus: matmul_float32"] == "passed"
        assert emulated["corpus: float64_tensor"].startswith("TypeError")
    markdown_text = (tmp_path / "selfcheck.md").read_text()
    assert markdown_text.count("\n| corpus: ") == len(corpus.CASES)


def test_a_verdict_outside_the_list_is_refused() -> None:
    with pytest.raises(ValueError, match="verdict 'fine' not in"):
        Item("x", "a", "b", "fine")


def test_the_markdown_escapes_table_cells() -> None:
    text = markdown("0", {}, [Item("x", "a | b", "c\nd", "differs")])
    assert "| x | a \\| b | c d | differs |" in text
