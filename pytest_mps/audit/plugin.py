"""``--mps-audit``: predict, on a machine without a Mac, what a suite would do on MPS.

Each test's aten ops (seen through the one watch mode of :mod:`pytest_mps.watch.mode`,
after decomposition) are looked up in the installed torch's own op table
(:mod:`pytest_mps.ops`), and their tensors' dtypes checked against what MPS
can hold. Findings travel on ``report.user_properties`` (so pytest-xdist works),
are listed per test and as a session table in the terminal summary, and go to
the ``--mps-report`` JSON under ``"mps_audit"``. ``--mps-audit=error`` fails
the tests with findings that ``@pytest.mark.mps_allow_fallback`` does not allow.

Sources, in order (each finding names its rule, source and certainty): the
argument rules of :mod:`pytest_mps.audit.rules`, the op table, and PyTorch's
own MPS test lists for the installed torch (:mod:`pytest_mps.audit.expectations`;
when they cannot be read, a one-line note says so and the yaml alone decides).
``--mps-audit-macos`` sets the macOS the prediction is for (default: newest).

On a Mac, ``--mps-audit-check`` compares each prediction for the ops the suite
ran with the dispatcher's own registrations and prints where they differ.
"""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from pytest_mps import ownership
from pytest_mps.audit.settings import (
    AUDIT_CHECK_HELP,
    AUDIT_HELP,
    LEVELS,
    MACOS_HELP,
    level_mistake,
    parse_macos,
    read_settings,
)
from pytest_mps.options import argparse_type

HOOKS = "pytest_mps.audit.hooks"
IGNORE_MARKER = (
    "mps_audit_ignore(*names, reason): --mps-audit findings of these kinds, "
    "dtypes or ops (host-sync, float64, aten::equal) are listed as ignored, "
    "with the reason, and never fail the test."
)
IGNORE_INI_HELP = (
    "--mps-audit findings to ignore in the code of a file or folder, one per "
    "line as 'path: name, name  # reason' (mypkg/legacy.py: float64  # old "
    "checkpoints); a name is a kind (host-sync, dtype, mixed-devices), a dtype "
    "or an aten op"
)


def pytest_addoption(parser: pytest.Parser, pluginmanager: Any) -> None:
    group = parser.getgroup("mps")
    # A bare --mps-audit is a flag; its levels are whole option strings
    # (--mps-audit=error), which argparse matches before splitting at "=", so
    # the word after a bare --mps-audit is never taken as its value: it stays
    # a path (pytest --mps-audit tests/).
    group.addoption(
        "--mps-audit",
        dest="mps_audit",
        action="store_const",
        const="report",
        default=None,
        help=AUDIT_HELP,
    )
    for level in LEVELS:
        group.addoption(
            f"--mps-audit={level}",
            dest="mps_audit",
            action="store_const",
            const=level,
            help=argparse.SUPPRESS,
        )
    group.addoption(
        "--mps-audit-check",
        dest="mps_audit_check",
        action="store_true",
        default=None,
        help=AUDIT_CHECK_HELP,
    )
    group.addoption(
        "--mps-audit-macos",
        dest="mps_audit_macos",
        default=None,
        type=argparse_type(parse_macos, "--mps-audit-macos"),
        metavar="VERSION",
        help=MACOS_HELP,
    )
    parser.addini("mps_audit", AUDIT_HELP, default="off")
    parser.addini("mps_audit_macos", MACOS_HELP, default=None)
    parser.addini("mps_audit_check", AUDIT_CHECK_HELP, type="bool", default=False)
    parser.addini("mps_audit_ignore", IGNORE_INI_HELP, type="linelist", default=[])
    # argparse refuses --mps-audit=eror with "ignored explicit argument" and
    # takes the word after a bare --mps-audit for a path: read the command
    # line, PYTEST_ADDOPTS and the ini's addopts first and say what was meant
    # (the config is registered as a plugin before any pytest11 plugin loads)
    config = pluginmanager.get_plugin("pytestconfig")
    if config is not None:
        for args, source in _given_args(config):
            mistake = level_mistake(args, config.invocation_params.dir, source)
            if mistake is not None:
                raise pytest.UsageError(mistake)


def _given_args(config: pytest.Config) -> list[tuple[list[str], str]]:
    """The arguments pytest parses, each list with where it comes from."""
    import os
    import shlex

    found = [([str(a) for a in config.invocation_params.args], "")]
    env = os.environ.get("PYTEST_ADDOPTS", "")
    if env.strip():
        found.append((shlex.split(env), "PYTEST_ADDOPTS"))
    try:  # read once the ini file is found, as it is for pytest11 plugins
        ini = [str(a) for a in config.getini("addopts")]
    except (ValueError, KeyError, AttributeError):
        ini = []
    if ini:
        name = config.inipath.name if config.inipath else "the ini file"
        found.append((ini, f"addopts of {name}"))
    return found


# startup.py calls this last: the hooks' configure runs after the watchers'
def pytest_configure(config: pytest.Config) -> None:
    ownership.register_markers(config, IGNORE_MARKER)
    if read_settings(config).level != "off":
        ownership.register_hooks(config, HOOKS)
    elif config.getini("mps_audit_ignore"):
        # the ini's silences are checked even while the audit is off
        from pytest_mps.audit import ignores

        ignores.parse_ini(config)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if ownership.closest_marker(item, "mps_audit_ignore") is None:
        return
    from pytest_mps.audit import ignores

    try:
        ignores.parse_marker(item)
    except ValueError as exc:
        pytest.fail(str(exc), pytrace=False)
