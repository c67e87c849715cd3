"""Shared test setup: torch loaded once, the running environment left as found.

pytester's in-process runs restore ``sys.modules`` afterwards; a torch (or a
torch submodule that registers operators) first imported inside such a run
would be dropped and imported again by the next one, which crashes the
interpreter or refuses the second registration. Importing them once here keeps
them loaded.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import signal
import site
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch

# Imported lazily by torch on the first __torch_dispatch__ of a tensor subclass
# (the emulated device's): loaded here for the reason above.
try:
    import torch.distributed.tensor  # noqa: F401
except ImportError:  # a torch built without distributed support
    pass
import torch._dynamo  # noqa: F401  (optimizer.step imports it)
import torch._subclasses.schema_check_mode  # noqa: F401
import torch.fx.experimental.symbolic_shapes  # noqa: F401

REPO = Path(__file__).resolve().parent.parent

# Tests press Ctrl-C (SIGINT) on purpose: on the template's training runs and on
# benchmark lock holders. A shell runs a background job (`cmd &`, no job
# control) with SIGINT ignored, and an ignored signal stays ignored in every
# child; Python then never raises KeyboardInterrupt. Restored here, the handler
# is reset to the default in each process this one starts.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def yaml_gives_mps_kernel(overload: str) -> bool:
    """True when the installed torch's native_functions.yaml lists an MPS kernel.

    Read as text, without the audit's classifier, so tests that depend on a fact
    of one torch release can say which releases it holds for.
    """
    from pytest_mps import ops as mps_ops

    text = mps_ops.yaml_paths()[0].read_text(encoding="utf-8")
    head = f"- func: {overload}("
    start = text.index(head)
    end = text.find("\n- func:", start + len(head))
    entry = text[start : end if end != -1 else len(text)]
    return any(
        "MPS" in line.partition(":")[0].replace(" ", "").split(",")
        for line in entry.splitlines()
        if line.startswith("    ")
    )


class FallbackOp(NamedTuple):
    """An op that falls back to the CPU on MPS in the installed torch."""

    #: the torch function, as Python source
    function: str
    #: the overload, as the audit names it
    name: str

    @property
    def source(self) -> str:
        """An expression applying it to a float32 tensor named ``x``: a tensor."""
        # frexp gives (mantissa, exponent)
        return f"{self.function}(x)" + ("[0]" if "frexp" in self.function else "")


#: (function, overload, overloads whose MPS kernel would run it on MPS), in
#: order of preference: frexp calls frexp.Tensor_out, which has an MPS kernel
#: from torch 2.15; ndtri and airy_ai have none in 2.6 to 2.15.
_FALLBACK_CANDIDATES = (
    ("torch.frexp", "frexp.Tensor", ("frexp.Tensor", "frexp.Tensor_out")),
    ("torch.special.ndtri", "special_ndtri", ("special_ndtri", "special_ndtri.out")),
    (
        "torch.special.airy_ai",
        "special_airy_ai",
        ("special_airy_ai", "special_airy_ai.out"),
    ),
)


def _fallback_op() -> FallbackOp:
    for function, overload, kernels in _FALLBACK_CANDIDATES:
        if not any(yaml_gives_mps_kernel(k) for k in kernels):
            return FallbackOp(function, f"aten::{overload}")
    raise RuntimeError(
        f"torch {torch.__version__} has MPS kernels for every op in "
        "_FALLBACK_CANDIDATES: add one its native_functions.yaml gives none"
    )


#: The op the tests use as "an op without an MPS kernel", read from the
#: installed torch's yaml, not the audit's table (which the tests check).
FALLBACK = _fallback_op()


def _common_mps_unusable() -> str | None:

    from pytest_mps.audit import expectations

    if not expectations.common_mps_path().exists():
        return (
            f"torch {torch.__version__} ships no torch/testing/_internal/"
            "common_mps.py (PyTorch's MPS test lists), which this test reads"
        )
    # the dev extra brings them; an environment without it reads no lists
    return _op_db_unusable()


def _op_db_unusable() -> str | None:
    import importlib.util

    missing = [m for m in ("numpy", "expecttest") if not importlib.util.find_spec(m)]
    return f"PyTorch's op_db needs {missing} (the dev extra)" if missing else None


#: Tracing OpInfo samples imports op_db, which needs numpy and expecttest.
needs_op_db = pytest.mark.skipif(
    _op_db_unusable() is not None, reason=str(_op_db_unusable())
)

#: torch/testing/_internal/common_mps.py, PyTorch's MPS test lists, is not in
#: every torch pyproject.toml allows (2.6 has none): the audit then predicts
#: from the yaml alone and says so in its header.
HAS_COMMON_MPS = _common_mps_unusable() is None
needs_common_mps = pytest.mark.skipif(
    not HAS_COMMON_MPS, reason=str(_common_mps_unusable())
)

#: torch 2.14's yaml gives _linalg_svd.U an MPS kernel (native MPS SVD, pytorch
#: PR #185954); before it, MPSFallback.mm ran linalg_svd on the CPU and svdvals,
#: cond or a nuclear norm fell back. Tests about those rules skip after it.
needs_svd_fallback = pytest.mark.skipif(
    yaml_gives_mps_kernel("_linalg_svd.U"),
    reason=f"torch {torch.__version__} runs _linalg_svd on MPS (native MPS SVD, "
    "pytorch PR #185954): the svd fallback rules this test is about held before",
)
TEMPLATE = REPO / "template"
Distribution = tuple[str, str, str]
# The default pytest_mps_source, `auto`, is read from the checkout the template
# is in, so it differs between a clone with a git remote and one without. Bakes
# that are not about it name this source instead (example.org: never installed).
STAND_IN_SOURCE = "git+https://example.org/pytest-mps.git@v0.1.0"


def running_site_dirs() -> list[str]:
    """The running interpreter's site-packages folders, in import order."""
    dirs = site.getsitepackages()
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return [d for d in dirs if Path(d).is_dir()]


def installed_distributions(dirs: list[str]) -> set[Distribution]:
    """Name, version and install origin (editable, URL) of every distribution."""
    return {
        (
            dist.metadata["Name"],
            dist.version,
            dist.read_text("direct_url.json") or "",
        )
        for dist in importlib.metadata.distributions(path=dirs)
    }


@pytest.fixture(scope="session")
def site_dirs() -> list[str]:
    """The site-packages folders of the environment running the tests."""
    return running_site_dirs()


@pytest.fixture(scope="session", autouse=True)
def _the_running_environment_is_left_as_found(site_dirs: list[str]) -> Iterator[None]:
    # A test that installs into this environment (pip install --prefix did, for a
    # baked project of the same name) uninstalls the user's own copy. Checked at
    # the end of the session, so the failure lands on the last test's teardown.
    before = installed_distributions(site_dirs)
    yield
    after = installed_distributions(site_dirs)
    gone = sorted(f"{n} {v}" for n, v, _ in before - after)
    new = sorted(f"{n} {v}" for n, v, _ in after - before)
    assert after == before, (
        f"the tests changed the environment they run in ({', '.join(site_dirs)}):"
        f" removed or changed {gone}, added {new}"
    )


@pytest.fixture(scope="session", autouse=True)
def _one_audit_cache_for_the_session(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[None]:
    # The audit's caches (the op table, op_db traced: ~25 s) live under the
    # user's cache dir, which pytester moves into each test's own HOME: every
    # audited run would trace op_db again. One folder for the session instead
    # (shared by pytest-xdist workers, whose base temps share a parent), and
    # never the user's own cache.
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTEST_MPS_CACHE_DIR", str(base / "pytest-mps-cache"))
        yield


@pytest.fixture
def expected_syncs_project(pytester: pytest.Pytester) -> pytest.Pytester:
    """A project whose ini names ``evaluation.py::mean_loss`` a read-back by
    design (``mps_expected_host_syncs``); ``evaluation.sloppy`` reads back too."""
    pytester.makeini(
        """
        [pytest]
        mps_expected_host_syncs =
            evaluation.py::mean_loss
        """
    )
    pytester.makepyfile(
        evaluation="""
        def mean_loss(losses):
            return losses.mean().item()  # one read-back per evaluation, by design

        def sloppy(losses):
            return losses.sum().item()
        """
    )
    return pytester


@pytest.fixture(scope="session")
def cookiecutter_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cookiecutter config file that keeps its replay files in this session's tmp.

    Without one, every bake writes ``~/.cookiecutter_replay/template.json``.
    """
    scratch = tmp_path_factory.mktemp("cookiecutter")
    config = scratch / "config.yaml"
    config.write_text(
        f"replay_dir: {json.dumps(str(scratch / 'replay'))}\n"
        f"cookiecutters_dir: {json.dumps(str(scratch / 'templates'))}\n"
    )
    return config


@pytest.fixture(scope="session")
def bake(cookiecutter_config: Path) -> Callable[..., Path]:
    """Bake the template with these answers, writing nothing outside pytest's tmp.

    Cookiecutter writes each rendered hook to a temporary file that it never
    deletes (cookiecutter/hooks.py, ``run_script_with_context``): here they go to a
    temporary folder removed after each bake.
    """
    from cookiecutter.main import cookiecutter

    def bake(output_dir: Path, **answers: str) -> Path:
        answers.setdefault("pytest_mps_source", STAND_IN_SOURCE)
        saved = tempfile.tempdir
        with tempfile.TemporaryDirectory(dir=cookiecutter_config.parent) as hooks:
            tempfile.tempdir = hooks
            try:
                return Path(
                    cookiecutter(
                        str(TEMPLATE),
                        no_input=True,
                        extra_context=answers,
                        output_dir=str(output_dir),
                        config_file=str(cookiecutter_config),
                    )
                )
            finally:
                tempfile.tempdir = saved

    return bake


def copy_of_this_checkout(into: Path, template: bool = True) -> Path:
    """This worktree's pytest-mps sources, committed or not, copied to `into`.

    Building or baking from the copy never writes in the repository (setuptools
    leaves build/ and *.egg-info/ in the folder it builds).
    """
    junk = shutil.ignore_patterns("__pycache__", "*.pyc")
    into.mkdir(parents=True)
    for folder in ("pytest_mps", "template") if template else ("pytest_mps",):
        shutil.copytree(REPO / folder, into / folder, ignore=junk)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, into / name)
    return into


def git(*args: str | Path, cwd: Path) -> str:
    """Run git in `cwd`, untouched by the user's git configuration; its output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env |= {
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "test",
        "GIT_AUTHOR_EMAIL": "test@example.org",
        "GIT_COMMITTER_NAME": "test",
        "GIT_COMMITTER_EMAIL": "test@example.org",
    }
    done = subprocess.run(
        ["git", *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, f"git {args}: {done.stderr}"
    return done.stdout.strip()


def commit_all(folder: Path) -> str:
    """Make `folder` a git repository holding its files in one commit; its hash."""
    git("init", "--quiet", "--initial-branch=main", cwd=folder)
    git("add", "--all", cwd=folder)
    git("commit", "--quiet", "--message=pytest-mps", cwd=folder)
    return git("rev-parse", "HEAD", cwd=folder)


# The public address the published clone's `origin` names. Nothing here reaches
# it: `Published.git_env` has git fetch it from the local repository instead.
FORGE_URL = "https://github.com/pytest-mps-tests/pytest-mps.git"


@dataclass(frozen=True)
class Published:
    """pytest-mps as a user clones it: `clone`, whose `origin` is FORGE_URL."""

    remote: Path  # a repository holding this worktree's sources in one commit
    clone: Path  # its clone, with `origin` = FORGE_URL, fetched from `remote`
    commit: str
    url: str = FORGE_URL

    def git_env(self) -> dict[str, str]:
        """Environment variables that make git fetch `url` from `remote`.

        git's ``url.<base>.insteadOf``, given as GIT_CONFIG_* variables (git
        2.31): pip clones the written ``git+https://github.com/...`` URL, as a CI
        machine would, and gets the local repository, with no network.
        """
        return {
            "GIT_CONFIG_COUNT": "1",
            "GIT_CONFIG_KEY_0": f"url.{self.remote.as_uri()}.insteadOf",
            "GIT_CONFIG_VALUE_0": self.url,
        }


@pytest.fixture(scope="session")
def published(tmp_path_factory: pytest.TempPathFactory) -> Published:
    """A clone of this checkout whose `origin` reads as a public forge's URL,
    though its commits come from a local repository (no network here)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    work = tmp_path_factory.mktemp("published")
    remote = copy_of_this_checkout(work / "pytest-mps")
    commit = commit_all(remote)
    git("clone", "--quiet", remote.as_uri(), work / "clone", cwd=work)
    git("remote", "set-url", "origin", FORGE_URL, cwd=work / "clone")
    return Published(remote, work / "clone", commit)


def bake_on_the_command_line(
    template: Path, output_dir: Path, config: Path, *answers: str
) -> subprocess.CompletedProcess[str]:
    """`cookiecutter TEMPLATE --no-input -o OUTPUT_DIR ANSWERS...`, as a user runs it.

    A process of its own: cookiecutter imports the template's extension module
    once per process, and `auto` reads the template's location from it.
    """
    tmp = output_dir.parent / f"{output_dir.name}-tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return subprocess.run(
        [sys.executable, "-m", "cookiecutter", str(template), "--no-input",
         "-o", str(output_dir), "--config-file", str(config), *answers],
        capture_output=True,
        text=True,
        env={**env, "TMPDIR": str(tmp)},
    )  # fmt: skip


@pytest.fixture(scope="session")
def baked_from_the_clone(
    published: Published,
    cookiecutter_config: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """The project baked with every default answer from the published clone."""
    out = tmp_path_factory.mktemp("from-clone")
    done = bake_on_the_command_line(
        published.clone / "template", out / "out", cookiecutter_config
    )
    assert done.returncode == 0, done.stdout + done.stderr
    project = out / "out" / "tiny-gpt"
    # one line, where the project went (cookiecutter itself says nothing)
    said = f"baked tiny-gpt into {project}: README.md there says what next\n"
    assert done.stdout == said and done.stderr == "", done.stdout + done.stderr
    return project


#: pytest-benchmark's own tests, run by test_benchmark_dropin.py under the alias.
collect_ignore = ["pytest_benchmark_suite"]


@pytest.fixture
def emulated() -> Iterator[Any]:
    """The emulated MPS device installed in this process for one test.

    The emulation's tests that check behaviour with real tensors (rather than
    through a user's suite in a subprocess) take it.
    """
    from pytest_mps.emulate.install import Emulation

    emulation = Emulation((99, 0), fallback=False)
    emulation.install()
    try:
        yield emulation
    finally:
        emulation.undo()
