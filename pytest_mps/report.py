"""The ``--mps-report PATH`` JSON file: sections that pytest-mps modules add.

API: ``add_report_section(config, name, data)`` puts ``data`` (anything
``json.dumps`` takes) under the top-level key ``name``. Call it on the
controller process (under pytest-xdist, build data from reports in
``pytest_runtest_logreport``, which the controller receives), at the latest in
``pytest_terminal_summary`` or ``pytest_sessionfinish``: the file is written
once, atomically (temporary file then ``os.replace``), in
``pytest_unconfigure``. Key ``"pytest_mps"`` holds the versions and devices.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from pytest_mps.options import argparse_check

REPORT_HELP = (
    "write what pytest-mps saw (fallback ops, host syncs, mixed devices, memory, "
    "...) as JSON to PATH, for CI tooling."
)

_sections_key: pytest.StashKey[dict[str, Any]] = pytest.StashKey()
_path_key: pytest.StashKey[Path | None] = pytest.StashKey()


def _parse_report_path(value: str, where: str) -> str:
    if not value.strip():
        raise ValueError(f"{where}: the path is empty; name a file, like report.json")
    return value


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mps")
    group.addoption(
        "--mps-report",
        dest="mps_report",
        type=argparse_check(_parse_report_path, "--mps-report"),
        metavar="PATH",
        default=None,
        help=REPORT_HELP,
    )
    parser.addini("mps_report", REPORT_HELP, default=None)


def pytest_configure(config: pytest.Config) -> None:
    value = config.getoption("mps_report") or config.getini("mps_report")
    path: Path | None = None
    # pytest-xdist workers leave the file to the controller
    if value and not hasattr(config, "workerinput"):
        path = Path(str(value)).expanduser()
        if not path.is_absolute():
            path = Path(config.invocation_params.dir) / path
    config.stash[_path_key] = path
    config.stash[_sections_key] = {}


def add_report_section(config: pytest.Config, name: str, data: Any) -> None:
    """Put ``data`` under ``name`` in the ``--mps-report`` JSON (if one is asked)."""
    config.stash.setdefault(_sections_key, {})[name] = data


def report_requested(config: pytest.Config) -> bool:
    """True when this process writes a ``--mps-report`` file."""
    return config.stash.get(_path_key, None) is not None


def _meta(config: pytest.Config) -> dict[str, Any]:
    from pytest_mps.devices import devices_key

    torch = sys.modules.get("torch")
    devices: list[str] = []
    if devices_key in config.stash:
        stored = config.stash[devices_key]
        devices = [*stored]
    try:
        version = importlib.metadata.version("pytest-mps")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover
        version = None
    from pytest_mps.machine.hooks import fingerprint

    return {
        "version": version,
        "torch": getattr(torch, "__version__", None),
        "devices": devices,
        "machine": fingerprint(config).as_dict(),
    }


def write_json_atomically(path: Path, data: Any) -> None:
    """Write ``data`` as JSON so readers never see a half-written file."""
    text = json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"
    write_text_atomically(path, text)


def write_text_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# startup.py calls this last
def pytest_unconfigure(config: pytest.Config) -> None:
    path = config.stash.get(_path_key, None)
    if path is None:
        return
    sections = config.stash.get(_sections_key, None) or {}
    data = {"pytest_mps": _meta(config), **sections}
    write_json_atomically(path, data)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    path = config.stash.get(_path_key, None)
    if path is not None:
        terminalreporter.write_line(f"pytest-mps: writing the report to {path}")
