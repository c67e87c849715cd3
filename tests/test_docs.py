"""The documentation site: its reference page against ``pytest --help``, its examples
run as test files, its install commands against the README's."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"


def reference_lists(cwd: Path) -> tuple[set[str], set[str]]:
    """The option spellings and ini keys the reference page is built from."""
    script = (
        f"import sys, json; sys.path.insert(0, {str(DOCS / '_ext')!r});"
        " import mps_reference as m; options, keys = m.collect();"
        " print(json.dumps([[n for names, _ in options for n in names],"
        " [k for k, _, _ in keys]]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=cwd, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    options, keys = json.loads(done.stdout.splitlines()[-1])
    return set(options), set(keys)


def test_the_reference_lists_every_option_and_ini_key_of_pytest_help(
    pytester: pytest.Pytester,
) -> None:
    result = pytester.runpytest("--help")
    text = result.stdout.str()
    # the option column: a line's spellings before its help text
    columns = re.findall(r"^  (-\S.*?)(?:\s{2,}|$)", text, re.M)
    shown = {o for c in columns for o in re.findall(r"(?<![\w-])(--mps[\w-]*)", c)}
    ini = set(re.findall(r"^  (mps_\w+) \(", text, re.M))
    options, keys = reference_lists(pytester.path)
    assert shown and ini
    assert {o for o in options if o.startswith("--mps")} == shown
    assert keys == ini


def test_the_reference_page_is_filled_from_the_definitions() -> None:
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        import mps_reference
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    page = mps_reference.markdown()
    assert "| `--mps-emulate` |" in page
    assert "| `mps_emulate_memory` |" in page
    assert "<!-- mps-reference -->" in (DOCS / "reference.md").read_text()


def python_examples() -> list[tuple[str, str]]:
    """(page:line, code) of every ```python block of the docs pages."""
    found = []
    for page in sorted(DOCS.glob("*.md")):
        text = page.read_text()
        for match in re.finditer(r"^```python\n(.*?)^```", text, re.M | re.S):
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{page.name}:{line}", match.group(1)))
    return found


@pytest.mark.parametrize(
    ("where", "code"), python_examples(), ids=[w for w, _ in python_examples()]
)
@pytest.mark.parametrize("options", [(), ("--mps-emulate",)], ids=["cpu", "emulated"])
def test_every_docs_example_passes_as_a_test_file(
    pytester: pytest.Pytester, where: str, code: str, options: tuple[str, ...]
) -> None:
    pytester.makepyfile(test_example=code)
    result = pytester.runpytest_subprocess(*options, "-p", "no:cacheprovider")
    outcomes = result.parseoutcomes()
    said = f"{where}: {result.stdout.str()[-2000:]}"
    assert outcomes.get("passed", 0) >= 1, said
    # a test an example marks for another device is skipped there, with a reason
    assert set(outcomes) <= {"passed", "skipped", "deselected", "warnings"}, said


def test_the_docs_have_examples_to_run() -> None:
    assert python_examples(), "no ```python block in docs/*.md"


def test_getting_started_installs_with_the_readme_commands() -> None:
    """The install block CI runs (the README's) is the one the docs show."""
    fence = r"```bash\n(# Linux: .*?)```"
    readme = (DOCS.parent / "README.md").read_text(encoding="utf-8")
    (ours,) = re.findall(fence, (DOCS / "getting-started.md").read_text(), re.S)
    (theirs,) = re.findall(r"<!-- command: install -->\n" + fence, readme, re.S)
    assert ours == theirs


def test_the_mac_ci_workflow_pins_the_image_and_keeps_the_fingerprint() -> None:
    yaml = pytest.importorskip("yaml")
    text = (DOCS / "mac-ci.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"```yaml\n(.*?)```", text, re.S)
    jobs = yaml.safe_load(block)["jobs"]
    mac = jobs["macos-mps"]
    assert mac["runs-on"] == "macos-15"  # a pinned image, not macos-latest
    command = mac["steps"][-2]["run"]
    for setting in (
        "--mps-virtual-gpu=run",
        "--mps-empty-cache=auto",
        "--mps-report=mps-report.json",
        "--junitxml=junit-mps.xml",
    ):
        assert setting in command
    assert mac["steps"][-1]["with"]["path"].split() == [
        "junit-mps.xml",
        "mps-report.json",
    ]
    linux = jobs["linux-emulated"]["steps"][-1]["run"]
    assert linux.startswith("pytest --mps-emulate")


def _page_text(path: Path) -> str:
    """A built page's text as a reader sees it: tags dropped, entities read."""
    import html
    from html.parser import HTMLParser

    class Text(HTMLParser):
        def __init__(self) -> None:
            super().__init__(convert_charrefs=True)
            self.parts: list[str] = []

        def handle_data(self, data: str) -> None:
            self.parts.append(data)

    reader = Text()
    reader.feed(path.read_text(encoding="utf-8"))
    return html.unescape(" ".join(" ".join(reader.parts).split()))


@pytest.fixture(scope="module")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("sphinx")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-E", "-q", "-b", "html", str(DOCS), str(out)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return out


def test_the_built_reference_shows_the_help_texts_as_written(
    built_site: Path,
) -> None:
    text = _page_text(built_site / "reference.html")
    # no "--" turned into an en dash, placeholders kept, "%" once
    assert "\u2013" not in text and "\u2014" not in text
    assert "STORAGE/<machine key>/NNNN_NAME.json" in text
    assert "PREFIX-<group>.png" in text
    assert "median:X% (default 5%)" in text and "%%" not in text
    assert "--mps-benchmark-compare-rev" in text


def test_the_built_reference_lists_every_marker_and_fixture(built_site: Path) -> None:
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        import mps_reference
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    text = _page_text(built_site / "reference.html")
    markers = mps_reference.markers()
    fixtures = mps_reference.fixtures()
    assert {"mps_memory", "mps_benchmark", "skip_device", "mps_timeout"} <= {
        signature.split("(")[0] for signature, _ in markers
    }
    assert {"device", "mps_memory", "mps_benchmark", "seed"} <= {
        name for name, _, _ in fixtures
    }
    for signature, help_text in markers:
        assert f"@pytest.mark.{signature} {' '.join(help_text.split())}" in text
    for name, gives, _ in fixtures:
        assert f"{name} {gives}" in text


def test_pytest_help_prints_percent_once(pytester: pytest.Pytester) -> None:
    text = pytester.runpytest("--help").stdout.str()
    assert "median:X% (default" in " ".join(text.split())
    assert "%%" not in text


def test_every_page_opens_with_a_sentence() -> None:
    for page in sorted(DOCS.glob("*.md")):
        lines = page.read_text(encoding="utf-8").splitlines()
        assert lines[0].startswith("# "), page.name
        first = next(line for line in lines[1:] if line.strip())
        # not code, a table, a list or a heading: words
        assert not first.startswith(("```", "|", "- ", "#", "<")), (page.name, first)
