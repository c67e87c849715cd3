"""Parity's options: repro bundles of failing checks, and the fresh-process rerun.

``--mps-parity-bundle=DIR`` (ini ``mps_parity_bundle``) makes each failing
parity check write a bundle to DIR; ``--mps-parity-fresh`` (ini
``mps_parity_fresh``) runs each failing check again in a fresh process and
says whether it fails there too. ``pytest DIR/x.mps-bundle.pt`` replays a
bundle as a test. Nothing here imports torch; without these options nothing
changes.
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from pytest_mps import ownership
from pytest_mps.parity import settings

BUNDLE_HELP = (
    "write a repro bundle (module, inputs, options, seed, machine fingerprint) "
    "of each failing parity check to DIR, as <test>.mps-bundle.pt; replay one "
    "with pytest DIR/<test>.mps-bundle.pt"
)
FRESH_HELP = (
    "run each failing parity check again in a fresh Python process and say "
    "whether it fails there too (if not, it depends on this process's state)"
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup(ownership.GROUP)
    group.addoption(
        "--mps-parity-bundle",
        dest="mps_parity_bundle",
        metavar="DIR",
        default=None,
        help=BUNDLE_HELP,
    )
    group.addoption(
        "--mps-parity-fresh",
        dest="mps_parity_fresh",
        action="store_true",
        default=None,
        help=FRESH_HELP,
    )
    parser.addini("mps_parity_bundle", BUNDLE_HELP, default=None)
    parser.addini("mps_parity_fresh", FRESH_HELP, type="bool", default=False)


def pytest_configure(config: pytest.Config) -> None:
    folder = config.getoption("mps_parity_bundle", None)
    if folder is None:
        folder = config.getini("mps_parity_bundle") or None
        if folder is not None:
            folder = str(config.rootpath / folder)
    flag = config.getoption("mps_parity_fresh", None)
    if flag is None:
        from pytest_mps.devices import ini_flag

        flag = ini_flag(config, "mps_parity_fresh")
    settings.directory[0] = Path(folder).resolve() if folder else None
    settings.fresh[0] = bool(flag)


def pytest_unconfigure(config: pytest.Config) -> None:
    settings.directory[0] = None
    settings.fresh[0] = False


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    if not settings.wanted():
        return (yield)
    settings.current_test[0] = item.nodeid
    try:
        return (yield)
    finally:
        settings.current_test[0] = None


def pytest_collect_file(
    file_path: Path, parent: pytest.Collector
) -> pytest.Collector | None:
    if file_path.name.endswith(settings.SUFFIX):
        from pytest_mps.parity.replay import BundleFile

        return BundleFile.from_parent(parent, path=file_path)
    return None
