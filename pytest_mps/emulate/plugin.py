"""``--mps-emulate``: run the suite on an emulated MPS device, on any machine.

The family's front door, loaded at start-up; it imports torch and the
emulation (:mod:`.install`, :mod:`.tagged`, :mod:`.policy`,
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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

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
MEMORY_HELP = (
    "the emulated Mac's memory, like 8GB or 64GB (default: no limit): live "
    "device tensors past PyTorch's MPS allocator limit (PYTORCH_MPS_HIGH_"
    "WATERMARK_RATIO, default 1.7, times 75%% of it) raise its out-of-memory "
    "error (with --mps-emulate)"
)

emulation_key: pytest.StashKey[Emulation] = pytest.StashKey()
#: Storages tagged in the process when the test's setup began.
made_key: pytest.StashKey[int] = pytest.StashKey()
HOOKS = "pytest_mps.emulate.hooks"
#: The report attribute that says a test made a device tensor (it travels
#: with the report from xdist workers and isolated children).
USED = "mps_emulated_device_used"
T = TypeVar("T")


def _parse_macos(value: str, where: str) -> tuple[int, int]:
    from pytest_mps.audit.settings import parse_macos

    return parse_macos(value, where)


def _parse_memory(value: str, where: str) -> int:
    from pytest_mps.emulate.memory import parse_memory

    return parse_memory(value, where)


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
    group.addoption(
        "--mps-emulate-memory",
        dest="mps_emulate_memory",
        type=argparse_type(_parse_memory, "--mps-emulate-memory"),
        metavar="SIZE",
        default=None,
        help=MEMORY_HELP,
    )
    parser.addini("mps_emulate", EMULATE_HELP, type="bool", default=False)
    parser.addini("mps_emulate_macos", MACOS_HELP, default=None)
    parser.addini("mps_emulate_memory", MEMORY_HELP.replace("%%", "%"), default=None)


def wanted(config: pytest.Config) -> bool:
    """``--mps-emulate`` or the ``mps_emulate`` ini setting."""
    value = config.getoption("mps_emulate", None)
    if value is None:
        value = getattr(config.known_args_namespace, "mps_emulate", None)
    if value is None:
        from pytest_mps.devices import ini_flag

        value = ini_flag(config, "mps_emulate")
    if not value:
        from pytest_mps.machine import virtual

        # --mps-virtual-gpu=emulate on a virtual GPU
        return virtual.emulates(config)
    return bool(value)


def _setting(
    config: pytest.Config, name: str, parse: Callable[[str, str], T]
) -> T | None:
    """The option ``name`` (parsed by its type), else its ini twin parsed here."""
    value = config.getoption(name, None)
    if value is None:
        value = getattr(config.known_args_namespace, name, None)
    if value is not None:
        return cast(T, value)
    ini = config.getini(name)
    if not ini:
        return None
    try:
        return parse(str(ini), f"ini option {name} in {config.inipath}")
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def _macos(config: pytest.Config) -> tuple[int, int]:
    from pytest_mps.audit.settings import NEWEST_MACOS, parse_macos

    value = _setting(config, "mps_emulate_macos", parse_macos)
    if value is None:
        return NEWEST_MACOS
    major, minor = value
    return int(major), int(minor)


def _memory(config: pytest.Config) -> int | None:
    from pytest_mps.emulate.memory import parse_memory

    value = _setting(config, "mps_emulate_memory", parse_memory)
    return None if value is None else int(value)


def _budget(config: pytest.Config) -> Any:
    from pytest_mps.emulate import memory

    size = _memory(config)
    if size is None:
        return None
    try:
        ratio = memory.watermark_ratio(os.environ)
    except (ValueError, RuntimeError) as exc:
        raise pytest.UsageError(
            f"--mps-emulate-memory: {exc} ({memory.VARIABLE} in the environment)"
            if isinstance(exc, RuntimeError)
            else f"--mps-emulate-memory: {exc}"
        ) from None
    return memory.Budget(size, ratio)


def _install(config: pytest.Config) -> None:
    if emulation_key in config.stash or not wanted(config):
        return
    from pytest_mps import backend

    if not backend.torch_installed():
        raise pytest.UsageError("--mps-emulate: torch is not installed")
    from pytest_mps.emulate import policy
    from pytest_mps.emulate.install import Emulation

    try:
        emulation = Emulation(
            _macos(config), policy.fallback_enabled(os.environ), _budget(config)
        )
    except ValueError as exc:
        raise pytest.UsageError(f"--mps-emulate: {exc}") from None
    emulation.install()
    config.stash[emulation_key] = emulation
    ownership.register_hooks(config, HOOKS)


def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    # After the watch family set PYTORCH_ENABLE_MPS_FALLBACK (tryfirst), before
    # pytest's own implementation (trylast) imports the initial conftest.py
    # files and, through them, the user's code.
    _install(early_config)


# startup.py calls this first
def pytest_configure(config: pytest.Config) -> None:
    _refuse_lone_options(config)
    # Before devices.py resolves the session's devices (plugin loaded late).
    _install(config)


def _refuse_lone_options(config: pytest.Config) -> None:
    """``--mps-emulate-macos`` / ``-memory`` without ``--mps-emulate``: a usage error.

    Without the emulation they would change nothing, and a run that passes
    would look like a run on that Mac. The ini settings are defaults for runs
    that ask for the emulation, and stay quiet.
    """
    if wanted(config):
        return
    for name, flag in (
        ("mps_emulate_macos", "--mps-emulate-macos"),
        ("mps_emulate_memory", "--mps-emulate-memory"),
    ):
        if config.getoption(name, None) is not None:
            raise pytest.UsageError(
                f"{flag} needs --mps-emulate: without it nothing is emulated "
                "and the run would not be the Mac it names"
            )
    # the ini defaults wait for a run that asks for the emulation; a bad one
    # is named now, not on the day someone passes --mps-emulate
    if config.getini("mps_emulate_macos"):
        _macos(config)
    if config.getini("mps_emulate_memory"):
        _memory(config)


def emulated_mac(config: pytest.Config) -> dict[str, Any] | None:
    """The emulated Mac for the machine's fingerprint, or None without emulation.

    ``macos`` (``"26.0"``), and with ``--mps-emulate-memory`` the ``memory``,
    its ``working_set`` and ``high_watermark`` in bytes.
    """
    emulation = config.stash.get(emulation_key, None)
    if emulation is None:
        return None
    from pytest_mps.emulate import host

    found: dict[str, Any] = {"macos": host.release(emulation.runtime.macos)}
    budget = emulation.budget
    if budget is not None:
        found.update(
            memory=budget.memory,
            working_set=budget.recommended,
            high_watermark=budget.limit,
        )
    return found


def pytest_unconfigure(config: pytest.Config) -> None:
    emulation = config.stash.get(emulation_key, None)
    if emulation is not None:
        emulation.undo()
        del config.stash[emulation_key]


def active(config: pytest.Config) -> Any:
    """The session's emulation, or None."""
    return config.stash.get(emulation_key, None)
