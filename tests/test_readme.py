"""README.md's usage examples, run as a user would: pytest on a file holding them.

The README is the door (two screens at most); the manual is docs/, whose python
examples test_docs.py runs. The commands of both pages are checked here.

Its commands (install, main job, tests) are run by .ci/run and
test_template_install.py, through .ci/readme_blocks.py; the benchmark table's
command here; the torchrun line by test_template_ddp.py. Commands that need an
Apple GPU (`pytest --mps ...`) say "on a Mac".
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from conftest import REPO

# Figures and commit hashes, which belong in docs/benchmarks.md: timings, ratios,
# and hex runs of 7 to 40 with a digit (so "defaced" is a word, not a hash).
FIGURES = re.compile(
    r"\d+(\.\d+)? ?(ms|µs|us)\b|\d\.\d+x\b|\b(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b"
)


DOCS = REPO / "docs"


def usage() -> str:
    """The README: what a newcomer reads first; the manual is docs/."""
    return (REPO / "README.md").read_text(encoding="utf-8")


def test_the_readme_fits_two_screens_and_starts_with_usage() -> None:
    text = usage()
    assert len(text.splitlines()) <= 200
    # after the title and the one-paragraph pitch, the first block is commands
    first_block = re.search(r"^```(\w+)\n(.*?)^```", text, re.M | re.S)
    assert first_block and first_block.group(1) == "bash"
    assert text.index(first_block.group(0)) < text.index("\n## ")
    commands = [line.split()[:2] for line in first_block.group(2).splitlines()]
    assert all(c[0] == "pytest" and c[1].startswith("--mps") for c in commands)


def test_every_docs_page_the_readme_links_is_in_the_docs_toctree() -> None:
    linked = set(re.findall(r"\]\(docs/([\w-]+)\.md", usage()))
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    listed = set(re.search(r"```\{toctree\}\n(.*?)```", index, re.S).group(1).split())
    assert linked and linked <= listed, linked - listed
    assert all((DOCS / f"{name}.md").is_file() for name in linked)


def test_the_first_screen_is_usage() -> None:
    headings = re.findall(r"^## (.+)$", usage(), re.M)
    assert headings[:4] == [
        "Install",
        "Run every test on every device",
        "Time the GPU honestly",
        "Catch fallbacks to the CPU",
    ]
    assert "The template: a GPT project, MPS-ready" in headings
    # Figures live in docs/benchmarks.md: no timings, ratios or commit hashes here.
    assert FIGURES.findall(usage()) == []


@pytest.mark.parametrize(
    "text",
    ["commit 416f0f3", "at 416f0f3e5", f"pinned {'416f0f3e' * 5}", "12.5 ms", "1.05x"],
)
def test_figures_and_hashes_of_any_length_are_caught(text: str) -> None:
    assert FIGURES.search(text), text


@pytest.mark.parametrize("text", ["a defaced file", "torch 2.13.0", "acceded"])
def test_words_and_versions_are_not_taken_for_hashes(text: str) -> None:
    assert FIGURES.search(text) is None, text


def section(title: str) -> str:
    """The README section under `## title`, up to the next heading of its level."""
    found = re.search(
        rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", usage(), re.M | re.S
    )
    assert found, f"README.md has no section {title!r}"
    return found.group(1)


@pytest.mark.parametrize(
    "title", ["Run every test on every device", "Time the GPU honestly"]
)
def test_the_usage_example_passes_on_the_cpu(
    pytester: pytest.Pytester, title: str
) -> None:
    (example,) = re.findall(r"```python\n(.*?)```", section(title), re.S)
    pytester.makepyfile(test_example=example)
    result = pytester.runpytest_subprocess("--device", "cpu", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_the_linux_fallback_command_audits_the_device_example(
    pytester: pytest.Pytester,
) -> None:
    commands = re.findall(
        r"```bash\n(.*?)```", section("Catch fallbacks to the CPU"), re.S
    )
    linux = [
        line.split("#")[0].split()
        for line in commands[0].splitlines()
        if line.rstrip().endswith(
            "# on Linux: which ops would fall back or fail on MPS"
        )
    ]
    assert linux == [["pytest", "--mps-audit"]]
    (example,) = re.findall(
        r"```python\n(.*?)```", section("Run every test on every device"), re.S
    )
    pytester.makepyfile(test_example=example)
    result = pytester.runpytest(*linux[0][1:], "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*1 tests audited*"])


def test_the_mac_bug_example_passes_on_linux_and_fails_under_emulation(
    pytester: pytest.Pytester,
) -> None:
    text = section("Catch Mac bugs on Linux")
    (example,) = re.findall(r"```python\n(.*?)```", text, re.S)
    pytester.makepyfile(test_example=example)
    plain = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    plain.assert_outcomes(passed=1)
    emulated = pytester.runpytest_subprocess("--mps-emulate", "-p", "no:cacheprovider")
    emulated.assert_outcomes(failed=1)
    # the message the README quotes is the one the test fails with
    (quoted,) = re.findall(r"\(`(Expected all.*?)`\)", text, re.S)
    emulated.stdout.fnmatch_lines([f"E   * RuntimeError: {' '.join(quoted.split())}"])


def test_the_emulation_reference_commands_run_as_written(
    pytester: pytest.Pytester,
) -> None:
    text = (DOCS / "emulation.md").read_text(encoding="utf-8")
    block = re.findall(r"```bash\n(.*?)```", text, re.S)[0]
    commands = [line.split("#")[0].split() for line in block.splitlines()]
    assert [c[0] for c in commands] == ["pytest", "pytest", "pytest"]
    (example,) = re.findall(
        r"```python\n(.*?)```", section("Catch Mac bugs on Linux"), re.S
    )
    pytester.makepyfile(test_example=example)
    for command in commands:
        result = pytester.runpytest_subprocess(*command[1:], "-p", "no:cacheprovider")
        result.assert_outcomes(failed=1)  # the Mac's bug, caught
        result.stdout.fnmatch_lines(["pytest-mps emulate: MPS emulated on the CPU*"])


def readme_blocks() -> ModuleType:
    """.ci/readme_blocks.py, imported from its file."""
    spec = importlib.util.spec_from_file_location(
        "readme_blocks", REPO / ".ci" / "readme_blocks.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_the_cpu_index_the_install_block_loses_only_its_index_url() -> None:
    blocks = readme_blocks()
    install = blocks.block("install")
    lines, reduced = install.splitlines(), blocks.without_index_url(install)
    torch_line = next(i for i, line in enumerate(lines) if "--index-url" in line)
    assert lines[torch_line] == (
        "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
    )
    assert reduced.splitlines() == [
        *lines[:torch_line],
        "pip install torch==2.13.0",
        *lines[torch_line + 1 :],
    ]
    assert blocks.without_index_url("pip install x --index-url=https://i/x y\n") == (
        "pip install x y\n"
    )


def test_the_benchmark_table_command_makes_the_table_and_the_plots(
    tmp_path: Path,
) -> None:
    """The reference's table command, as written, from a folder holding docs/."""
    pytest.importorskip("matplotlib", reason="--mps-benchmark-histogram draws with it")
    text = (DOCS / "timing.md").read_text(encoding="utf-8")
    shown = re.search(r"^## The table\n\n```\n\$ (.*?)\n```", text, re.M | re.S)
    assert shown, "docs/timing.md has no table under '## The table'"
    command, _, table = shown.group(1).replace("\\\n", " ").partition("\n")
    args = command.split()
    assert args[0] == "pytest"
    shutil.copytree(REPO / "docs" / "examples", tmp_path / "docs" / "examples")
    (tmp_path / "docs" / "img").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    done = subprocess.run(
        [sys.executable, "-m", *args],
        cwd=tmp_path,
        env={**env, "TMPDIR": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    def titles_and_rows(output: str) -> list[str]:
        """Group titles (any device) and row names, in order."""
        found = re.findall(
            r"pytest-mps benchmark: (\d+ measured) on \S+ (\(group '\w+'\))"
            r"|^(test_\w+\[\w+\]) ",
            output,
            re.M,
        )
        return [" ".join(filter(None, parts)) for parts in found]

    assert titles_and_rows(done.stdout) == titles_and_rows(table)
    assert len(titles_and_rows(table)) == 9  # 2 groups, 7 rows
    plots = sorted(p.name for p in (tmp_path / "docs" / "img").iterdir())
    assert plots == sorted(p.name for p in (REPO / "docs" / "img").glob("bench-*.png"))
    for plot in (tmp_path / "docs" / "img").iterdir():
        assert plot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n"), plot


def test_every_command_that_needs_a_mac_says_so() -> None:
    pages = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]
    text = "".join(page.read_text(encoding="utf-8") for page in pages)
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    mac_only = [
        line
        for block in blocks
        for line in block.splitlines()
        if re.match(r"pytest\b.*--mps(\s|$)", line)
    ]
    assert mac_only, "README.md shows no `pytest --mps` command"
    for line in mac_only:
        assert "# on a Mac" in line, line
