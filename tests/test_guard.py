"""A guest never takes a session down: a fault injected into each hook of ours.

A ``-p inject`` module, imported by pytest before any installed plugin, makes
one function that a hook of pytest-mps calls raise. A plain suite must still
pass, told in one line that pytest-mps is off; a run that asked for pytest-mps
(``--mps-emulate``) must get one error line naming pytest-mps, never pytest's
``INTERNALERROR``.
"""

from __future__ import annotations

import pytest

from pytest_mps import __version__

pytest_plugins = ["pytester"]

#: hook -> (module, function) that the hook calls
FAULTS = {
    "pytest_addhooks": ("pytest_mps.plugin", "own_surface"),
    "pytest_addoption": ("pytest_mps.seeding", "pytest_addoption"),
    "pytest_load_initial_conftests": ("pytest_mps.flags", "before_conftests"),
    "pytest_configure": ("pytest_mps.devices", "pytest_configure"),
    "pytest_report_header": ("pytest_mps.environment", "pytest_report_header"),
    "pytest_collect_file": ("pytest_mps.parity.plugin", "pytest_collect_file"),
    "pytest_generate_tests": ("pytest_mps.devices", "pytest_generate_tests"),
    "pytest_collection_modifyitems": (
        "pytest_mps.devices",
        "pytest_collection_modifyitems",
    ),
    "pytest_runtest_setup": ("pytest_mps.devices", "pytest_runtest_setup"),
    "pytest_runtest_makereport": ("pytest_mps.seeding", "note_report"),
    "pytest_terminal_summary": ("pytest_mps.report", "pytest_terminal_summary"),
    "pytest_unconfigure": ("pytest_mps.watch.plugin", "pytest_unconfigure"),
}

INJECT = """
import importlib

module = importlib.import_module({module!r})


def fault(*args, **kwargs):
    raise RuntimeError("injected fault")


setattr(module, {function!r}, fault)
"""


def _inject(pytester: pytest.Pytester, hook: str) -> None:
    module, function = FAULTS[hook]
    pytester.makepyfile(inject=INJECT.format(module=module, function=function))


def test_without_a_fault_both_suites_pass_and_nothing_is_off(
    pytester: pytest.Pytester,
) -> None:
    """The control for the faults below, on each pytest CI installs."""
    pytester.makepyfile(test_plain="def test_plain():\n    assert 1 + 1 == 2\n")
    plain = pytester.runpytest_subprocess("-p", "no:cacheprovider", "test_plain.py")
    plain.assert_outcomes(passed=1)
    pytester.makepyfile(
        test_device="def test_device(device):\n    assert device.type == 'mps'\n"
    )
    emulated = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--mps-emulate", "test_device.py"
    )
    emulated.assert_outcomes(passed=1)
    for result in (plain, emulated):
        output = result.stdout.str() + result.stderr.str()
        assert "INTERNALERROR" not in output
        assert "pytest-mps is off" not in output


@pytest.mark.parametrize("hook", sorted(FAULTS))
def test_a_fault_in_a_hook_of_ours_leaves_a_plain_suite_green(
    pytester: pytest.Pytester, hook: str
) -> None:
    _inject(pytester, hook)
    pytester.makepyfile(test_plain="def test_plain():\n    assert 1 + 1 == 2\n")
    result = pytester.runpytest_subprocess("-p", "inject", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert result.ret == 0
    line = (
        f"pytest-mps {__version__}: RuntimeError: injected fault (in {hook}); "
        "pytest-mps is off for this session"
    )
    lines = result.stdout.lines + result.stderr.lines
    assert lines.count(line) == 1, (result.stdout.str(), result.stderr.str())
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    # off: none of ours speaks after the fault (no header line, no summary)
    if hook not in ("pytest_unconfigure", "pytest_terminal_summary"):
        result.stdout.no_fnmatch_line("pytest-mps: torch*")


@pytest.mark.parametrize("hook", sorted(FAULTS))
def test_a_fault_in_a_run_that_asked_for_us_is_one_line_naming_pytest_mps(
    pytester: pytest.Pytester, hook: str
) -> None:
    _inject(pytester, hook)
    pytester.makepyfile(
        test_device="def test_device(device):\n    assert device.type == 'mps'\n"
    )
    result = pytester.runpytest_subprocess(
        "-p", "inject", "-p", "no:cacheprovider", "--mps-emulate"
    )
    output = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in output
    summary = (
        f"pytest-mps {__version__}: RuntimeError: injected fault (in {hook}): "
        "a bug in pytest-mps, not in your suite"
    )
    assert summary in output, output
    assert result.ret != 0
    # the traceback is kept, down to the injected function
    assert 'raise RuntimeError("injected fault")' in output
    assert "pytest-mps is off for this session" not in output
