"""``--mps-emulate``: run the suite on an emulated MPS device, on any machine.

The family's front door, loaded at start-up; it imports torch and the
emulation (:mod:`.install`, :mod:`.tensor`, :mod:`.calls`, :mod:`.policy`,
:mod:`.serialization`) only when a run asks for it. The emulation is
installed before the conftest files are imported (``pytest_load_initial_
conftests``), so device selection at import time (``torch.device("mps" if
torch.backends.mps.is_available() else "cpu")``) already picks it, and
removed in ``pytest_unconfigure``. The session's devices become ``mps``, as
under ``--mps``: every test taking the ``device`` fixture runs on it.

``PYTORCH_ENABLE_MPS_FALLBACK`` is left as the environment has it, as a Mac
has it out of the box: without it an op with no MPS kernel raises PyTorch's
NotImplementedError. ``--mps-fallback=warn`` sets it and lists every such op
instead, as on ``pytest --mps``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import pytest

from pytest_mps import ownership
from pytest_mps.options import argparse_type

if TYPE_CHECKING:
    from pytest_mps.emulate.install import Emulation

EMULATE_HELP = (
    "run the suite on an emulated MPS device that computes on the CPU: tensors "
    "say mps:0 and follow MPS's rules (placement, missing ops, float64, host "
    "reads) with PyTorch's own messages, so a Mac's failures show on Linux. "
    "The session's device is mps, as under --mps."
)
MACOS_HELP = (
    "the macOS version the emulated Mac runs, like 13.5 (default: the newest): "
    "bfloat16 needs 14.0 (with --mps-emulate)"
)

_emulation_key: pytest.StashKey[Emulation] = pytest.StashKey()


def _parse_macos(value: str, where: str) -> tuple[int, int]:
    from pytest_mps.audit.settings import parse_macos

    return parse_macos(value, where)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup(ownership.GROUP)
    group.addoption(
        "--mps-emulate",
        dest="mps_emulate",
        action="store_true",
        default=None,
        help=EMULATE_HELP,
    )
    group.addoption(
        "--mps-emulate-macos",
        dest="mps_emulate_macos",
        type=argparse_type(_parse_macos, "--mps-emulate-macos"),
        metavar="VERSION",
        default=None,
        help=MACOS_HELP,
    )
    parser.addini("mps_emulate", EMULATE_HELP, type="bool", default=False)
    parser.addini("mps_emulate_macos", MACOS_HELP, default=None)


def wanted(config: pytest.Config) -> bool:
    """``--mps-emulate`` or the ``mps_emulate`` ini setting."""
    value = config.getoption("mps_emulate", None)
    if value is None:
        value = getattr(config.known_args_namespace, "mps_emulate", None)
    if value is None:
        value = config.getini("mps_emulate")
    return bool(value)


def _macos(config: pytest.Config) -> tuple[int, int]:
    from pytest_mps.audit.settings import NEWEST_MACOS, parse_macos

    value = config.getoption("mps_emulate_macos", None)
    if value is None:
        value = getattr(config.known_args_namespace, "mps_emulate_macos", None)
    if value is not None:
        major, minor = value
        return int(major), int(minor)
    ini = config.getini("mps_emulate_macos")
    if not ini:
        return NEWEST_MACOS
    where = f"ini option mps_emulate_macos in {config.inipath}"
    try:
        return parse_macos(str(ini), where)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def _install(config: pytest.Config) -> None:
    if _emulation_key in config.stash or not wanted(config):
        return
    from pytest_mps import backend

    if not backend.torch_installed():
        raise pytest.UsageError("--mps-emulate: torch is not installed")
    from pytest_mps.emulate import policy
    from pytest_mps.emulate.install import Emulation

    emulation = Emulation(_macos(config), policy.fallback_enabled(os.environ))
    emulation.install()
    config.stash[_emulation_key] = emulation


def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    # After the watch family set PYTORCH_ENABLE_MPS_FALLBACK (tryfirst), before
    # pytest's own implementation (trylast) imports the initial conftest.py
    # files and, through them, the user's code.
    _install(early_config)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # Before devices.py resolves the session's devices (plugin loaded late).
    _install(config)


def pytest_report_header(config: pytest.Config) -> str | None:
    emulation = config.stash.get(_emulation_key, None)
    if emulation is None:
        return None
    macos = emulation.runtime.macos
    target = "newest" if macos[0] >= 99 else f"{macos[0]}.{macos[1]}"
    fallback = (
        "PYTORCH_ENABLE_MPS_FALLBACK=1: ops without an MPS kernel fall back"
        if emulation.policy.fallback
        else "PYTORCH_ENABLE_MPS_FALLBACK unset: ops without an MPS kernel raise"
    )
    return (
        f"pytest-mps emulate: MPS emulated on the CPU (macOS {target}, op table "
        f"of torch {emulation.policy.table.torch_version}); {fallback}"
    )


def pytest_unconfigure(config: pytest.Config) -> None:
    emulation = config.stash.get(_emulation_key, None)
    if emulation is not None:
        emulation.undo()
        del config.stash[_emulation_key]


def active(config: pytest.Config) -> Any:
    """The session's emulation, or None."""
    return config.stash.get(_emulation_key, None)
