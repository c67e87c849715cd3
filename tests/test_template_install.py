"""A baked project installed as on a fresh machine, then run: its tests, its README.

No package index serves pytest-mps yet, so a wheel built from this checkout stands
in for one: the project's `dev` extra is installed with `--no-index` and that wheel
as the only place pytest-mps can come from. Everything happens in a throwaway
environment; the one running these tests is never installed into.

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
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from packaging.utils import canonicalize_name

pytest.importorskip("cookiecutter.main")

REPO = Path(__file__).resolve().parent.parent
Bake = Callable[..., Path]


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


def pytest_mps_checkout(into: Path) -> Path:
    """A copy of this checkout's package sources: building never writes in the repo.

    (setuptools leaves build/ and *.egg-info/ in the folder it builds.)
    """
    junk = shutil.ignore_patterns("__pycache__", "*.pyc")
    into.mkdir(parents=True)
    shutil.copytree(REPO / "pytest_mps", into / "pytest_mps", ignore=junk)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, into / name)
    return into


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding only a pytest-mps wheel built from this checkout."""
    work = tmp_path_factory.mktemp("wheelhouse")
    checkout = pytest_mps_checkout(work / "pytest-mps")
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
    return python


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
    bake: Bake,
    wheelhouse: Path,
    site_dirs: list[str],
) -> tuple[Path, Path]:
    """The default project, installed with its dev extra: (project, its python)."""
    needs_hatchling()
    work = tmp_path_factory.mktemp("installed")
    project = bake(work, pytest_mps_source=">=0.1,<0.2")  # the default, said here
    python = throwaway_environment(work, site_dirs, {"pytest-mps", project.name})
    # Not editable (`-e`): the wheel is what a user of the package gets (is the
    # corpus packaged? is the command created?), and hatchling's editable mode
    # needs the `editables` package. The dev extra resolves the same either way.
    pip_install(python, wheelhouse, ".[dev]", cwd=project)
    return project, python


def test_the_dev_extra_installs_pytest_mps_from_the_wheels_given(
    installed: tuple[Path, Path], tmp_path: Path
) -> None:
    project, python = installed
    # find_spec locates without importing: no torch start-up paid here.
    where = run(
        [python, "-c", "from importlib.util import find_spec as f;"
         " print(f('pytest_mps').origin, f('torch').origin)"],
        cwd=tmp_path,
        env=quiet_env(tmp_path / "tmp"),
    ).split()  # fmt: skip
    venv = python.parent.parent
    assert Path(where[0]).is_relative_to(venv), where  # the wheel, installed there
    assert not Path(where[1]).is_relative_to(venv), where  # torch, not reinstalled


def test_the_generated_projects_own_tests_pass_with_the_installed_plugin(
    installed: tuple[Path, Path],
) -> None:
    project, python = installed
    output = run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=project,
        env=quiet_env(project.parent / "tmp"),
    )
    summary = output.strip().splitlines()[-1]
    assert re.search(r"\d+ passed", summary), summary
    assert not re.search(r"failed|skipped|error", summary), output[-3000:]
    # The plugin ran: its benchmark fixture printed its table.
    assert "test_a_training_step_is_timed_on_the_device[cpu]" in output


def readme_main_job(project: Path) -> list[str]:
    """The commands between the README's main-job markers, comments dropped."""
    readme = (project / "README.md").read_text()
    block = re.search(r"<!-- main-job -->\n```bash\n(.*?)```", readme, re.S)
    assert block, "README has no main-job block"
    lines = [ln.split("#")[0].strip() for ln in block.group(1).splitlines()]
    return [ln for ln in lines if ln]


def test_the_readme_main_job_prepares_trains_and_samples(
    installed: tuple[Path, Path],
) -> None:
    """The README's commands after its install line, with the project installed."""
    project, python = installed
    commands = readme_main_job(project)
    assert commands[0] == "pip install -e ."  # done by the `installed` fixture
    env = quiet_env(
        project.parent / "tmp",
        PATH=os.pathsep.join([str(python.parent), os.environ["PATH"]]),
    )
    outputs = [
        run(["sh", "-c", command], cwd=project, env=env) for command in commands[1:]
    ]
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


@pytest.mark.parametrize("answer", ["checkout", "wheel"])
def test_a_path_answer_installs_pytest_mps_from_that_path(
    tmp_path: Path, bake: Bake, wheelhouse: Path, site_dirs: list[str], answer: str
) -> None:
    needs_hatchling()
    if answer == "checkout":
        source = pytest_mps_checkout(tmp_path / "pytest-mps")
    else:
        source = next(wheelhouse.glob("*.whl"))
    project = bake(tmp_path / "out", pytest_mps_source=str(source))
    python = throwaway_environment(tmp_path, site_dirs, {"pytest-mps", project.name})
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    # What pip would install, and from where, without installing it.
    report = pip_install(
        python, empty, "--dry-run", "--quiet", "--report", "-", ".[dev]", cwd=project
    )
    chosen = {
        item["metadata"]["name"]: item["download_info"]["url"]
        for item in json.loads(report)["install"]
    }
    assert chosen == {project.name: project.as_uri(), "pytest-mps": source.as_uri()}
