"""Known failures pinned in a manifest: xfail as listed, fail the run on any change.

``--mps-known-failures=PATH`` reads the manifest (:mod:`.manifest`); the path may
hold ``{device}`` (the session's device type: mps under ``--mps-emulate``) and
``{macos}`` (the macOS major version, the emulated one under ``--mps-emulate``,
``none`` off a Mac), so a project keeps one file per device and macOS release.
A listed test that fails with the listed type (and message substring) on the
listed device is reported as an xfail; one that passes, is skipped, or fails
another way fails with a one-line reason. ``--mps-known-failures-write`` writes
the file from the run, on the controller under pytest-xdist: the exception type
of each failure travels on its report's ``user_properties``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from pytest_mps import ownership

if TYPE_CHECKING:
    from pytest_mps.known_failures.state import State

PATH_HELP = (
    "a manifest of known failures (node id | exception type | device | message "
    "substring): a listed test failing that way is an xfail; one that passes, is "
    "skipped or fails another way fails the run. {device} and {macos} in the "
    "path pick a file per device type and macOS major version"
)
WRITE_HELP = (
    "write (or refresh) the --mps-known-failures file from this run's failures, "
    "sorted; lines of tests this run did not run are kept"
)
_state_key: pytest.StashKey[State] = pytest.StashKey()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup(ownership.GROUP)
    group.addoption(
        "--mps-known-failures",
        dest="mps_known_failures",
        metavar="PATH",
        default=None,
        help=PATH_HELP,
    )
    group.addoption(
        "--mps-known-failures-write",
        dest="mps_known_failures_write",
        action="store_true",
        default=None,
        help=WRITE_HELP,
    )
    parser.addini("mps_known_failures", PATH_HELP, default=None)


def _macos_major(config: pytest.Config) -> str:
    from pytest_mps.backend import macos_version
    from pytest_mps.devices import emulated

    if emulated(config):
        from pytest_mps.audit.settings import NEWEST_MACOS
        from pytest_mps.emulate.plugin import _macos

        macos = _macos(config)
        return "newest" if macos == NEWEST_MACOS else str(macos[0])
    version = macos_version()
    return version.split(".")[0] if version else "none"


def session_device(config: pytest.Config) -> str:
    """The session's first device type (``mps``, ``cuda``, ``cpu``)."""
    from pytest_mps.devices import devices_key

    devices = config.stash.get(devices_key, None) or ["cpu"]
    return str(devices[0]).split(":")[0]


def manifest_path(config: pytest.Config) -> tuple[str, str] | None:
    """``(path, where it was set)`` with its placeholders filled in, or None."""
    value = config.getoption("mps_known_failures", None)
    where = f"--mps-known-failures={value}"
    if value is None:
        value = config.getini("mps_known_failures")
        where = f"mps_known_failures in {config.inipath}"
        if not value:
            return None
    try:
        path = str(value).format(
            device=session_device(config), macos=_macos_major(config)
        )
    except (KeyError, IndexError, ValueError) as exc:
        raise pytest.UsageError(
            f"{where}: the path's placeholders are {{device}} and {{macos}}, not {exc}"
        ) from None
    return str(config.invocation_params.dir / path), where


# startup.py calls this last: after devices.py has resolved the devices
def pytest_configure(config: pytest.Config) -> None:
    found = manifest_path(config)
    writing = bool(config.getoption("mps_known_failures_write", None))
    if found is None:
        if writing:
            raise pytest.UsageError(
                "--mps-known-failures-write: give the file with "
                "--mps-known-failures=PATH (or the mps_known_failures ini key)"
            )
        return
    from pytest_mps.known_failures.state import State

    state = State(config, *found, session_device(config))
    config.stash[_state_key] = state
    config.pluginmanager.register(state, "pytest-mps-known-failures")


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(_state_key, None)
    if state is not None:
        config.pluginmanager.unregister(state)
        del config.stash[_state_key]
