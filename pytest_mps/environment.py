"""The session header and the ``mps_environment`` fixture: what the tests run on.

What they report is read by :mod:`.mps_environment`, imported only when a
header line or the fixture needs it.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import pytest

from pytest_mps import ownership
from pytest_mps.devices import devices_key

if TYPE_CHECKING:
    from pytest_mps.mps_environment import MpsEnvironment


def pytest_report_header(config: pytest.Config) -> list[str]:
    yielded = ownership.yielded_line(config)
    if not ownership.opted_in(config):
        # A guest's header: one line at most, and none for a suite without torch.
        if "torch" not in sys.modules:
            return [f"pytest-mps: {yielded}"] if yielded else []
        from pytest_mps.mps_environment import read_environment

        line = read_environment(config, chip=False, check=False).header()[0]
        return [f"{line}; {yielded}" if yielded else line]
    from pytest_mps.mps_environment import read_environment

    chosen: list[str] = config.stash[devices_key]
    verbose = config.get_verbosity() > 0
    lines = read_environment(config, chip="mps" in chosen or verbose).header()
    if yielded:
        lines[0] += f"; {yielded}"
    from pytest_mps.machine.hooks import header_lines

    lines[1:1] = header_lines(config)
    return lines


@pytest.fixture(scope="session")
def mps_environment(pytestconfig: pytest.Config) -> MpsEnvironment:
    """What the session runs on: torch version, devices, MPS state, macOS, chip."""
    from pytest_mps.mps_environment import read_environment

    return read_environment(pytestconfig)
