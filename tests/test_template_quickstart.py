"""The generated README's quickstart describes the preset the project was made with."""

from __future__ import annotations

import importlib
import math
import re
import sys
from pathlib import Path

import pytest

cookiecutter_main = pytest.importorskip("cookiecutter.main")

TEMPLATE = Path(__file__).resolve().parent.parent / "template"


def quickstart(project: Path) -> dict[str, str]:
    """The main job's commands, each with its comment: {'prepare': '# data/...'}."""
    readme = (project / "README.md").read_text()
    block = re.search(r"<!-- main-job -->\n```bash\n(.*?)```", readme, re.S)
    assert block, "README has no main-job block"
    comments = {}
    for line in block.group(1).splitlines():
        command, _, comment = line.partition("#")
        words = command.split()
        if len(words) > 1 and words[0] == project.name:
            comments[words[1]] = comment.strip()
    return comments


@pytest.mark.parametrize("preset", ["tiny", "shakespeare_char", "gpt2"])
def test_the_quickstart_describes_the_chosen_presets_data_and_model(
    tmp_path: Path, preset: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = Path(
        cookiecutter_main.cookiecutter(
            str(TEMPLATE),
            no_input=True,
            extra_context={"project_name": "Quick GPT", "preset": preset},
            output_dir=str(tmp_path),
        )
    )
    monkeypatch.syspath_prepend(str(project / "src"))
    try:
        config = importlib.import_module("quick_gpt.config").PRESETS[preset]
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == "quick_gpt"]:
            del sys.modules[name]
    steps = quickstart(project)
    assert steps["prepare"].startswith(f"data/{config['dataset']}:")
    char = config["tokenizer"] == "char"
    assert ("one token per character" in steps["prepare"]) == char
    assert ("GPT-2 BPE" in steps["prepare"]) == (not char)
    # The first loss is about ln(vocabulary): the corpus's characters, or GPT-2's.
    corpus = next(project.glob("src/*/corpus/shakespeare.txt")).read_text("utf-8")
    vocab = len(set(corpus)) if char else 50257
    first = float(re.search(r"loss falls from ~([\d.]+)", steps["train"]).group(1))
    assert first == pytest.approx(math.log(vocab), abs=0.2)
    readme = (project / "README.md").read_text()
    if preset != "tiny":  # too large for a CPU: the run warns, and tiny is named
        assert "warns with the figure it measured" in readme
        assert "`--preset=tiny`" in readme
