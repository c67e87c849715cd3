"""Release readiness: the sdist and wheel that a tag would publish.

They are built from a copy of this checkout as the release workflow builds them
(``python -m build``, here without build isolation: no package index), then
checked as it checks them: ``twine check --strict`` and .ci/check_release.py.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from conftest import REPO, copy_of_this_checkout

pytest.importorskip("build", reason="the dev extra's `build`: pip install -e '.[dev]'")
pytest.importorskip("twine", reason="the dev extra's `twine`: pip install -e '.[dev]'")

CHECK = REPO / ".ci" / "check_release.py"
WHEEL = "pytest_mps-0.1.0-py3-none-any.whl"
SDIST = "pytest_mps-0.1.0.tar.gz"
URLS = {
    "Homepage": "https://github.com/owner/pytest-mps",
    "Source": "https://github.com/owner/pytest-mps",
    "Issues": "https://github.com/owner/pytest-mps/issues",
}
GITHUB = {
    "GITHUB_SERVER_URL": "https://github.com",
    "GITHUB_REPOSITORY": "owner/pytest-mps",
}


def run(args: list[object], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")}
    return subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env={**env, "TMPDIR": str(cwd)},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and the wheel, built from this checkout's sources."""
    work = tmp_path_factory.mktemp("release")
    checkout = copy_of_this_checkout(work / "pytest-mps", template=False)
    built = run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", work / "dist",
         checkout],
        cwd=work,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert sorted(p.name for p in (work / "dist").iterdir()) == [WHEEL, SDIST]
    return work / "dist"


@pytest.fixture(scope="module")
def check() -> ModuleType:
    """.ci/check_release.py, imported from its file."""
    spec = importlib.util.spec_from_file_location("check_release", CHECK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_twine_accepts_the_sdist_and_the_wheel(dist: Path) -> None:
    done = run(
        [
            sys.executable,
            "-m",
            "twine",
            "check",
            "--strict",
            dist / WHEEL,
            dist / SDIST,
        ],
        cwd=dist.parent,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("PASSED") == 2, done.stdout


# A readme as the release steps leave it: PyPI named, every link absolute.
RELEASED_README = (
    "# pytest-mps\n\n`pip install pytest-mps`; see"
    " [the benchmarks](https://github.com/owner/pytest-mps/blob/v0.1.0/docs/b.md)"
    " and [Install](#install).\n"
)


def test_the_metadata_is_complete_and_the_readme_is_the_description(
    dist: Path, check: ModuleType
) -> None:
    meta = check.read_metadata(dist / WHEEL)
    assert meta["License-Expression"] == "MIT" and meta["License-File"] == "LICENSE"
    classifiers = meta.get_all("Classifier")
    assert "Framework :: Pytest" in classifiers and "Typing :: Typed" in classifiers
    assert meta.get_payload() == (REPO / "README.md").read_text(encoding="utf-8")


def test_without_urls_the_check_prints_the_lines_to_add(
    dist: Path, check: ModuleType
) -> None:
    meta = check.read_metadata(dist / WHEEL)
    del meta["Project-URL"]  # as built before the maintainers add them
    meta.set_payload(RELEASED_README)
    assert check.problems(meta, "v0.1.0", {}) == [
        "no project URL for Homepage, Source, Issues: add to pyproject.toml's"
        " [project.urls]:"
        '\n    Homepage = "https://github.com/OWNER/REPO"'
        '\n    Source = "https://github.com/OWNER/REPO"'
        '\n    Issues = "https://github.com/OWNER/REPO/issues"'
    ]


def test_the_check_of_the_built_files_names_what_the_release_steps_leave_to_do(
    dist: Path, check: ModuleType
) -> None:
    """Whether or not the steps are done yet: the suite must pass both before the
    first release and after the maintainers follow the README's release steps."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    left = check.readme_problems(readme)
    if set(URLS) - set(project.get("urls", {})):
        left.append("no project URL for ")
    done = run([sys.executable, CHECK, dist, "--tag", "v0.1.0"], cwd=dist.parent)
    said = [line for line in done.stderr.splitlines() if not line.startswith("    ")]
    assert len(said) == len(left), done.stderr
    for line, problem in zip(sorted(said), sorted(left), strict=True):
        assert line.startswith(f"{WHEEL} and {SDIST}: {problem}"), done.stderr
    assert done.returncode == (1 if left else 0), done.stdout + done.stderr
    assert ("ready to publish" in done.stdout) == (not left)


def test_a_readme_that_pypi_would_show_wrong_is_named_part_by_part(
    check: ModuleType,
) -> None:
    readme = (
        "pytest-mps is not on PyPI\nyet. See [the docs](docs/benchmarks.md),\n"
        "![plot](docs/img/bench.png), [home](https://example.org/x.md),\n"
        '[up](#install), <img src="img/logo.svg"> and [ref][r].\n\n'
        "[r]: template/README.md\n\n"
        "```markdown\n[in code](not/a/link.md)\n```\n`[inline](code.md)`\n"
    )
    assert check.readme_problems(readme) == [
        "the readme says pytest-mps is not on PyPI yet: update its Install section"
        " for the release",
        "the readme links to files PyPI does not have: docs/benchmarks.md,"
        " docs/img/bench.png, template/README.md, img/logo.svg; make these links"
        " and images absolute (https://github.com/OWNER/REPO/blob/vX.Y.Z/...)",
    ]
    assert check.readme_problems(RELEASED_README) == []


def test_with_the_urls_in_the_check_passes_the_version_of_the_tag_alone(
    dist: Path, check: ModuleType
) -> None:
    for dist_file in (dist / WHEEL, dist / SDIST):
        meta = check.read_metadata(dist_file)
        del meta["Project-URL"]
        for label, url in URLS.items():
            meta["Project-URL"] = f"{label}, {url}"  # adds one more header
        meta.set_payload(RELEASED_README)
        assert check.problems(meta, "v0.1.0", GITHUB) == []
        assert check.problems(meta, "v0.1.1", GITHUB) == [
            "tag 'v0.1.1' is not v0.1.0, the version built"
        ]
        fork = {**GITHUB, "GITHUB_REPOSITORY": "fork/pytest-mps"}
        assert check.problems(meta, "v0.1.0", fork) == [
            "Source is https://github.com/owner/pytest-mps, but this release is"
            " built from https://github.com/fork/pytest-mps"
        ]


def test_the_release_workflow_publishes_a_tested_checked_tag_with_no_stored_token() -> (
    None
):
    yaml = pytest.importorskip("yaml")
    workflow = yaml.safe_load(
        (REPO / ".github" / "workflows" / "release.yml").read_text()
    )
    assert workflow.get("on", workflow.get(True)) == {"push": {"tags": ["v*"]}}
    jobs = workflow["jobs"]
    assert jobs["test"]["steps"][-1]["run"] == "bash .ci/run"
    checks = "\n".join(step.get("run", "") for step in jobs["build"]["steps"])
    assert "twine check --strict dist/*" in checks
    assert '.ci/check_release.py dist --tag "$TAG"' in checks
    publish = jobs["publish"]
    assert sorted(publish["needs"]) == ["build", "test"]
    assert publish["permissions"] == {"id-token": "write"}
    upload = publish["steps"][-1]
    # Trusted publishing: no password or token given to the upload.
    assert upload["uses"] == "pypa/gh-action-pypi-publish@release/v1"
    assert "with" not in upload
