"""Shared test setup: torch loaded once, the running environment left as found.

pytester's in-process runs restore ``sys.modules`` afterwards; a torch first
imported inside such a run would be dropped and imported again by the next one,
which crashes the interpreter. Importing it once here keeps it loaded.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import site
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch  # noqa: F401

TEMPLATE = Path(__file__).resolve().parent.parent / "template"
Distribution = tuple[str, str, str]


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
