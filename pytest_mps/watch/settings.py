"""The watching family's settings: options, markers and modes, read once per session.

Light on purpose: pytest imports it at start-up (through :mod:`.plugin`), so it
builds no classes and compiles no patterns. The watchers import from here,
never from :mod:`.plugin`.
"""

from __future__ import annotations

import os
import re

import pytest

from pytest_mps.devices import devices_key, emulated
from pytest_mps.options import choice

FALLBACK_HELP = (
    "what to do with ops that fall back from MPS to the CPU: 'warn' lists them "
    "per test and in the summary, 'error' fails the test listing them, 'off' "
    "leaves PYTORCH_ENABLE_MPS_FALLBACK and torch's warnings alone. Under "
    "warn/error pytest-mps sets PYTORCH_ENABLE_MPS_FALLBACK=1 before torch loads. "
    "Default: warn when the session runs on MPS (--mps), off otherwise."
)
ALLOW_HELP = "ops allowed to fall back to the CPU, one per line (aten::_linalg_svd)"
MIXED_HELP = (
    "flag ops whose tensors live on more than one device where a Mac fails (a "
    "CPU tensor beside GPU tensors; a 0-dim one in a kernel that binds it as a "
    "Metal buffer, lerp's weight); other 0-dim CPU scalars are noted, never "
    "failed: 'error' fails the test, 'warn' reports, 'off'. Default: error "
    "under --mps and --mps-emulate, off otherwise."
)
EVERY_OP_HELP = (
    "watch every aten op of a watched test: no skipping of calls known to be "
    "clean (F.linear on one device, ...), at several us per op"
)
EXPECTED_SYNCS_HELP = (
    "functions whose host syncs are by design, one per line as path::function "
    "(src/pkg/train.py::evaluate; a path suffix, the function's name or "
    "qualified name): syncs made directly in them are neither failed by "
    "no_host_sync / forbid_host_sync() nor listed by --mps-audit"
)
MODES = ("error", "warn", "off")
VARIABLE = "PYTORCH_ENABLE_MPS_FALLBACK"

MARKERS = (
    "mps_allow_fallback(*ops): these ops (aten::_linalg_svd, ...) may fall back "
    "to the CPU in this test; with no ops, every op may.",
    "no_host_sync: fail at the first op that makes the host wait for the device "
    "(.item(), copies to the host, nonzero, bool masks, ...), naming the op and "
    "line. On CPU, CPU tensors count as device tensors.",
    "no_mixed_devices: fail the test if an op mixes tensors of several devices "
    "as a Mac refuses (a CPU tensor beside GPU tensors, a 0-dim CPU lerp weight).",
    "mps_memory(max_mb=None, leak_mb=None): report the test's peak device "
    "memory and what it left allocated; fail above max_mb peak or leak_mb left.",
)

#: Names of the rows a test's report carries (``report.user_properties``).
FINDINGS_PROPERTY = "pytest_mps.findings"
MEMORY_PROPERTY = "pytest_mps.memory"

parse_mode = choice(MODES, "mode")

#: The session's mixed-device mode (error, warn, off).
mixed_mode_key: pytest.StashKey[str] = pytest.StashKey()

#: Whether the running test's device is the CPU: ``forbid_host_sync()``'s default
#: for counting CPU tensors as device tensors. Set before each test.
running_on_cpu = [False]
#: The session's expected host syncs, as (path suffix, function) pairs; set
#: before each test for ``forbid_host_sync()``, which has no test at hand.
expected_syncs: list[tuple[tuple[str, str], ...]] = [()]
#: The same pairs, read once per session.
expected_syncs_key: pytest.StashKey[tuple[tuple[str, str], ...]] = pytest.StashKey()


def parse_expected_syncs(config: pytest.Config) -> tuple[tuple[str, str], ...]:
    """The ``mps_expected_host_syncs`` lines as (path suffix, function) pairs."""
    found = []
    for line in config.getini("mps_expected_host_syncs"):
        path, sep, function = str(line).strip().rpartition("::")
        if not sep or not path or not function:
            raise pytest.UsageError(
                f"ini option mps_expected_host_syncs in {config.inipath}: {line!r} "
                "is not path::function (src/pkg/train.py::evaluate)"
            )
        found.append((path.replace("\\", "/"), function))
    return tuple(found)


def _ini_mode(config: pytest.Config, name: str) -> str | None:
    ini = config.getini(name)
    if not ini:
        return None
    try:
        return parse_mode(str(ini), f"ini option {name} in {config.inipath}")
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def targets_mps(config: pytest.Config, early: bool = False) -> bool:
    """Whether the session asked for the MPS device (--mps, --device mps, ini)."""
    # in pytest_load_initial_conftests only the known args are parsed yet, and
    # a short flag read there may turn out to be the project's own
    if not early:
        return "mps" in config.stash.get(devices_key, [])
    space = config.known_args_namespace
    if getattr(space, "mps_only", False) or emulated(config):
        return True
    values = [*(getattr(space, "mps_devices", None) or [])]
    values += config.getini("mps_devices")
    return any(str(v).strip().lower().startswith("mps") for v in values)


def fallback_mode(config: pytest.Config, early: bool = False) -> str:
    """``--mps-fallback`` > ini > warn on an MPS session > off (a guest's default).

    Under ``--mps-emulate`` the default follows the environment, as a Mac's
    torch does: warn when ``PYTORCH_ENABLE_MPS_FALLBACK`` is set there, else
    off, so an op without an MPS kernel raises PyTorch's own error.
    """
    value = config.getoption("mps_fallback")
    if value is None and early:
        value = getattr(config.known_args_namespace, "mps_fallback", None)
    if value is not None:
        return str(value)
    ini = _ini_mode(config, "mps_fallback")
    if ini is not None:
        return ini
    if emulated(config):
        # read before pytest-mps sets it (the early call) and after: the same
        value = os.environ.get(VARIABLE, "0").strip()
        return "warn" if value not in ("", "0") else "off"
    return "warn" if targets_mps(config, early) else "off"


def mixed_mode(config: pytest.Config) -> str:
    """``--mps-mixed-devices`` > ini > error on an MPS session > off."""
    value = config.getoption("mps_mixed_devices")
    if value is None:
        value = _ini_mode(config, "mps_mixed_devices")
    if value is None:
        value = "error" if targets_mps(config) else "off"
    return str(value)


def every_op(config: pytest.Config) -> bool:
    """``--mps-watch-every-op`` or its ini twin."""
    value = config.getoption("mps_watch_every_op")
    return bool(config.getini("mps_watch_every_op") if value is None else value)


# compiled on first use (re's cache): 50 us of every start-up otherwise
_OP_NAME = r"^(\w+::)?[A-Za-z_]\w*(\.\w+)?$"


def check_allowed_fallbacks(config: pytest.Config) -> None:
    """Each ``mps_allow_fallback`` line is an op name; one usage line otherwise."""
    for line in config.getini("mps_allow_fallback"):
        if not re.match(_OP_NAME, str(line).strip()):
            raise pytest.UsageError(
                f"ini option mps_allow_fallback in {config.inipath}: {str(line)!r} "
                "is not an op name such as aten::_linalg_svd or "
                "aten::index.Tensor"
            )
