"""A baked project installed as on a fresh CI machine, then run: its tests, READMEs.

The project is baked with every default answer from a clone of this checkout
whose `origin` is a github.com URL (conftest's `published`), so its `pinned` extra
names pytest-mps as `git+https://github.com/...@<commit>`; the workflow's own
install command then installs it with no package index: pip clones that URL,
which git's ``insteadOf`` (`Published.git_env`) fetches from a local repository.
Everything happens in throwaway environments; the one running these tests is
never installed into.

That environment sees the running one's packages (torch is not installed again)
through a folder of links to its site-packages, leaving out pytest-mps and the
baked project's own distribution, which pip must therefore install from the wheels.
(`python -m venv --system-site-packages` would not do: run from inside a venv, it
exposes the base interpreter's packages, not the venv's.)

The subprocesses run with one intra-op thread: the models are tiny, and on a 2-core
CI machine shared with other work, two OpenMP threads spin against each other
(250 ms/step instead of 12 ms measured here).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from conftest import Published, copy_of_this_checkout
from packaging.utils import canonicalize_name

pytest.importorskip("cookiecutter.main")

REPO = Path(__file__).resolve().parent.parent
Bake = Callable[..., Path]
WORKFLOW = ".github/workflows/ci.yml"
# The install step of the generated workflow: pip and torch (PyTorch's CPU index)
# need a package index; the project's line is run here as written.
WORKFLOW_INSTALL = [
    "python -m pip install --upgrade pip",
    "pip install torch --index-url https://download.pytorch.org/whl/cpu",
    'pip install -e ".[pinned]"',
]


def readme_blocks() -> ModuleType:
    """.ci/readme_blocks.py: README.md's command blocks, as .ci/run reads them."""
    spec = importlib.util.spec_from_file_location(
        "readme_blocks", REPO / ".ci" / "readme_blocks.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def quiet_env(tmp: Path, **extra: str) -> dict[str, str]:
    """This process's environment for a subprocess: no pip config, tmp files in tmp.

    TMPDIR catches what the subprocess leaves in the temporary folder (its own
    pytest's basetemp, tiktoken's cache, torch's); pip reads no configuration
    file or PIP_* variable, so only the options given here decide what it does.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("VIRTUAL_ENV", None)
    tmp.mkdir(parents=True, exist_ok=True)
    return {
        **env,
        "OMP_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "TMPDIR": str(tmp),
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        **extra,
    }


def run(args: list[Any], cwd: Path, env: dict[str, str], timeout: int = 300) -> str:
    done = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, (
        f"{' '.join(map(str, args))}\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding only a pytest-mps wheel built from this checkout."""
    work = tmp_path_factory.mktemp("wheelhouse")
    checkout = copy_of_this_checkout(work / "pytest-mps", template=False)
    wheels = work / "wheels"
    run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-index",
         "--no-build-isolation", "-w", wheels, checkout],
        cwd=work,
        env=quiet_env(work / "tmp"),
    )  # fmt: skip
    assert [w.name for w in wheels.iterdir()] == ["pytest_mps-0.1.0-py3-none-any.whl"]
    return wheels


def throwaway_environment(root: Path, site_dirs: list[str], hide: set[str]) -> Path:
    """Make a venv at root that sees the running environment but `hide`; its python.

    Each site-packages entry of the running interpreter is linked into
    root/running-env (first folder wins, as on sys.path), except the files of
    the distributions named in `hide`; a .pth file puts that folder on the venv's
    path after its own site-packages, so what pip installs there comes first.
    """
    run(
        [sys.executable, "-m", "venv", "--without-pip", root / "venv"], root, os.environ
    )
    python = root / "venv" / "bin" / "python"
    view = root / "running-env"
    view.mkdir()
    hidden = {canonicalize_name(name) for name in hide}
    for folder in map(Path, site_dirs):
        left_out = {"__pycache__"}
        for dist in importlib.metadata.distributions(path=[str(folder)]):
            if canonicalize_name(dist.metadata["Name"]) in hidden:
                left_out |= {Path(f).parts[0] for f in dist.files or ()}
        for entry in folder.iterdir():
            metadata = entry.suffix in (".dist-info", ".egg-info")
            if metadata and canonicalize_name(entry.name.split("-")[0]) in hidden:
                continue
            # .pth files are not read from a plain path entry: leave them out.
            if entry.name in left_out or entry.suffix == ".pth":
                continue
            if not (view / entry.name).exists():
                (view / entry.name).symlink_to(entry)
    purelib = run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        root,
        os.environ,
    ).strip()
    (Path(purelib) / "running-env.pth").write_text(f"{view}\n")
    # `pip`, as the READMEs and the workflow type it: the running pip, installing
    # into this venv (a venv made --without-pip has none of its own).
    pip = python.parent / "pip"
    pip.write_text(f'#!/bin/sh\nexec "{python}" -m pip "$@"\n')
    pip.chmod(0o755)
    return python


def shell_env(python: Path, tmp: Path) -> dict[str, str]:
    """The environment of a shell in `python`'s venv, where pip has no index.

    pip reads PIP_* variables as its options: no index, and the build backends
    (hatchling, setuptools) taken from the venv, which sees the running ones.
    """
    return quiet_env(
        tmp,
        PATH=os.pathsep.join([str(python.parent), os.environ["PATH"]]),
        VIRTUAL_ENV=str(python.parent.parent),
        PIP_NO_INDEX="1",
        PIP_NO_BUILD_ISOLATION="0",  # pip's spelling of --no-build-isolation
    )


def needs_hatchling() -> None:
    """Skip, saying how to fix it, where the baked project cannot be built offline."""
    pytest.importorskip(
        "hatchling",
        reason="hatchling (the baked project's build backend) is not installed here:"
        " pip install -e '.[dev]' again",
    )


def pip_install(python: Path, wheels: Path, *args: Any, cwd: Path) -> str:
    """Install into `python`'s environment with no index: only `wheels` and links."""
    return run(
        [sys.executable, "-m", "pip", "--python", python, "install",
         "--no-index", "--find-links", wheels, "--no-build-isolation", *args],
        cwd=cwd,
        env=quiet_env(cwd.parent / "tmp"),
    )  # fmt: skip


@pytest.fixture(scope="module")
def installed(
    tmp_path_factory: pytest.TempPathFactory,
    baked_from_the_clone: Path,
    published: Published,
    site_dirs: list[str],
) -> tuple[Path, Path]:
    """The default project, installed by its workflow's command: (project, python)."""
    needs_hatchling()
    yaml = pytest.importorskip("yaml")
    project = baked_from_the_clone
    workflow = yaml.safe_load((project / WORKFLOW).read_text())
    install = next(
        step["run"].splitlines()
        for step in workflow["jobs"]["linux-cpu"]["steps"]
        if step.get("name", "").startswith("Install")
    )
    assert install == WORKFLOW_INSTALL
    work = tmp_path_factory.mktemp("installed")
    python = throwaway_environment(work, site_dirs, {"pytest-mps", project.name})
    env = shell_env(python, work / "tmp") | published.git_env()
    run(["sh", "-c", install[-1]], cwd=project, env=env)
    return project, python


def test_the_workflows_install_step_gets_pytest_mps_from_the_commit_baked_from(
    installed: tuple[Path, Path], published: Published, tmp_path: Path
) -> None:
    _, python = installed
    # find_spec locates without importing: no torch start-up paid here.
    script = (
        "import importlib.metadata as m, importlib.util as u;"
        " print(u.find_spec('pytest_mps').origin, u.find_spec('torch').origin);"
        " print(m.distribution('pytest-mps').read_text('direct_url.json'))"
    )
    where, origin = run(
        [python, "-c", script], cwd=tmp_path, env=quiet_env(tmp_path / "tmp")
    ).splitlines()
    plugin, torch_file = where.split()
    venv = python.parent.parent
    assert Path(plugin).is_relative_to(venv), where  # pytest-mps, installed there
    assert not Path(torch_file).is_relative_to(venv), where  # torch, not again
    direct = json.loads(origin)
    assert direct["url"] == published.url
    assert direct["vcs_info"]["commit_id"] == published.commit


def run_the_projects_tests(
    installed: tuple[Path, Path], *options: str, allowed: str = ""
) -> str:
    """The baked project's own suite, run with these pytest options; its output.

    It must pass: no test failed or errored, and no outcome but those in
    ``allowed`` (``"skipped"``) besides passes.
    """
    project, python = installed
    output = run(
        [python, "-m", "pytest", *options, "-q", "-p", "no:cacheprovider"],
        cwd=project,
        env=quiet_env(project.parent / "tmp"),
    )
    summary = output.strip().splitlines()[-1]
    assert re.search(r"\d+ passed", summary), summary
    refused = {"failed", "skipped", "error"} - {allowed}
    assert not re.search("|".join(sorted(refused)), summary), output[-3000:]
    return output


def test_the_generated_projects_own_tests_pass_on_the_emulated_device(
    installed: tuple[Path, Path],
) -> None:
    # the generated workflow's step, as written: its whole suite as on a Mac
    # (two tests skip there: one needs MPS unavailable, one a CPU run)
    project = installed[0]
    workflow = (project / ".github" / "workflows" / "ci.yml").read_text()
    step = re.search(
        r"- name: Tests on an emulated MPS device\n\s+run: (.+)\n", workflow
    )
    assert step, "the workflow has no emulated-MPS step"
    command = step.group(1).split()
    assert command == ["pytest", "--mps-emulate"]
    output = run_the_projects_tests(installed, *command[1:], allowed="skipped")
    # the device-taking tests ran on the emulated device (the benchmark's table)
    assert "test_a_training_step_is_timed_on_the_device[mps]" in output


def readme_main_job(project: Path) -> list[str]:
    """The generated README's commands between its main-job markers, no comments."""
    readme = (project / "README.md").read_text()
    block = re.search(r"<!-- main-job -->\n```bash\n(.*?)```", readme, re.S)
    assert block, "README has no main-job block"
    lines = [ln.split("#")[0].strip() for ln in block.group(1).splitlines()]
    return [ln for ln in lines if ln]


def test_the_readme_main_job_runs_twice_in_a_row(
    published: Published,
    cookiecutter_config: Path,
    installed: tuple[Path, Path],
    site_dirs: list[str],
    tmp_path: Path,
) -> None:
    """README.md's main job, as written, from the root of a clone, twice.

    After baking, it runs the generated README's own main job, so this runs both.
    """
    main_job = readme_blocks().block("main-job")
    # the project's commands run in a subshell, so the shell stays in the clone
    steps = [
        step.strip().lstrip("(").rstrip(")")
        for step in main_job.replace("\\\n", " ").split("&&")
    ]
    after_cd = steps[steps.index('cd "$demo/tiny-gpt"') + 1 :]
    assert after_cd == readme_main_job(installed[0])
    python = throwaway_environment(tmp_path, site_dirs, {"tiny-gpt"})
    env = shell_env(python, tmp_path / "tmp")
    # cookiecutter from the running environment; its replay file in pytest's tmp.
    env["PATH"] += os.pathsep + str(Path(sys.executable).parent)
    env["COOKIECUTTER_CONFIG"] = str(cookiecutter_config)
    for _ in range(2):
        output = run(["bash", "-euo", "pipefail", "-c", main_job],
                     cwd=published.clone, env=env, timeout=600)  # fmt: skip
        assert "prepared data/shakespeare_char" in output
        evals = [
            float(v) for v in re.findall(
                r"^step \d+: train loss [\d.]+, val loss ([\d.]+)", output, re.M)
        ]  # fmt: skip
        assert len(evals) >= 2 and evals[-1] < evals[0] - 0.8, output
        assert "MFU unknown for" in output  # a CPU has no peak-FLOPS entry
        _, trained, sampled = output.rpartition("checkpoint: out/ckpt.pt\n")
        assert trained and len(sampled.split("-" * 40)[0].strip()) > 100, output
    # Two projects, each trained: nothing was replaced, nothing refused.
    checkpoints = sorted((tmp_path / "tmp").glob("tmp.*/tiny-gpt/out/ckpt.pt"))
    assert len(checkpoints) == 2, checkpoints


def test_the_projects_wheel_holds_the_corpus_and_the_command(
    installed: tuple[Path, Path], tmp_path: Path
) -> None:
    """What a user of the built package gets (the install above is editable)."""
    project, _ = installed
    run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-index",
         "--no-build-isolation", "-w", tmp_path, project],
        cwd=tmp_path,
        env=quiet_env(tmp_path / "tmp"),
    )  # fmt: skip
    (wheel,) = tmp_path.glob("tiny_gpt-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(n for n in names if n.endswith("entry_points.txt"))
        commands = archive.read(entry_points).decode()
    assert "tiny_gpt/corpus/shakespeare.txt" in names
    assert "tiny-gpt = tiny_gpt.cli:main" in commands


@pytest.mark.parametrize("answer", ["checkout", "wheel", "range"])
def test_a_path_or_range_answer_installs_pytest_mps_from_there(
    tmp_path: Path, bake: Bake, wheelhouse: Path, site_dirs: list[str], answer: str
) -> None:
    needs_hatchling()
    wheel = next(wheelhouse.glob("*.whl"))
    if answer == "checkout":
        source = copy_of_this_checkout(tmp_path / "pytest-mps", template=False)
        project = bake(tmp_path / "out", pytest_mps_source=str(source))
    elif answer == "wheel":
        source = wheel
        project = bake(tmp_path / "out", pytest_mps_source=str(source))
    else:  # the wheels folder stands in for a package index
        source = wheel
        project = bake(tmp_path / "out", pytest_mps_source=">=0.1,<0.2")
    python = throwaway_environment(tmp_path, site_dirs, {"pytest-mps", project.name})
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    # What pip would install, and from where, without installing it.
    report = pip_install(
        python,
        wheelhouse if answer == "range" else empty,
        *("--dry-run", "--quiet", "--report", "-", ".[pinned]"),
        cwd=project,
    )
    chosen = {
        item["metadata"]["name"]: item["download_info"]["url"]
        for item in json.loads(report)["install"]
    }
    assert chosen == {project.name: project.as_uri(), "pytest-mps": source.as_uri()}


def test_the_generated_projects_own_tests_pass_installed_with_no_audit_finding(
    installed: tuple[Path, Path], tmp_path: Path
) -> None:
    # One run for two claims (each run of the suite takes about 65 s of CI's 2
    # cores): the suite passes with the installed plugin, and it is clean under
    # --mps-audit=error (issue 22; its workflow runs =report), which fails any
    # test with a finding. The report goes outside the shared project.
    report = tmp_path / "audit.json"
    output = run_the_projects_tests(
        installed, "--mps-audit=error", f"--mps-report={report}"
    )
    # The plugin ran: its benchmark fixture printed its table.
    assert "test_a_training_step_is_timed_on_the_device[cpu]" in output
    tests = json.loads(report.read_text())["mps_audit"]["tests"]
    assert tests, "no test was audited"
    # reads in the tests' own asserts are listed apart, counted against nothing
    found = [
        (name, row["kind"], row["name"], row["first"])
        for name, rows in tests.items()
        for row in rows
        if row["side"] != "test"
    ]
    assert found == []
    assert re.search(r"^(\d+) tests audited, \1 without findings", output, re.M)


def test_the_dev_extra_keeps_an_editable_pytest_mps_that_pinned_would_replace(
    tmp_path: Path,
    baked_from_the_clone: Path,
    published: Published,
    site_dirs: list[str],
) -> None:
    """The README's way: bake in the venv holding the clone, editable; install dev."""
    needs_hatchling()
    project = baked_from_the_clone
    python = throwaway_environment(tmp_path, site_dirs, {"pytest-mps", project.name})
    clone = copy_of_this_checkout(tmp_path / "pytest-mps", template=False)
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    pip_install(python, empty, "--no-deps", "-e", clone, cwd=tmp_path)
    script = (
        "import importlib.metadata as m, importlib.util as u;"
        " print(u.find_spec('pytest_mps').origin);"
        " print(m.distribution('pytest-mps').read_text('direct_url.json'))"
    )

    def pytest_mps_in_place() -> None:
        where, origin = run(
            [python, "-c", script], cwd=tmp_path, env=quiet_env(tmp_path / "tmp")
        ).splitlines()
        assert Path(where).is_relative_to(clone), where
        direct = json.loads(origin)
        assert direct == {"url": clone.as_uri(), "dir_info": {"editable": True}}

    pytest_mps_in_place()
    said = pip_install(python, empty, "-e", ".[dev]", cwd=project)
    assert "Requirement already satisfied: pytest-mps in" in said, said
    installs = [ln for ln in said.splitlines() if ln.startswith("Successfully inst")]
    assert installs == [f"Successfully installed {project.name}-0.1.0"], said
    pytest_mps_in_place()
    # what `pinned` would do: pytest-mps from the commit the project was baked from
    report = run(
        [sys.executable, "-m", "pip", "--python", python, "install", "--no-index",
         "--no-build-isolation", "--dry-run", "--quiet", "--report", "-",
         "-e", ".[pinned]"],
        cwd=project,
        env=quiet_env(tmp_path / "tmp") | published.git_env(),
    )  # fmt: skip
    chosen = {
        item["metadata"]["name"]: item["download_info"]["url"]
        for item in json.loads(report)["install"]
    }
    assert chosen["pytest-mps"] == published.url
