"""The machine's front door: the fingerprint in every result, virtual GPUs.

- The fingerprint (:func:`fingerprint`): the header line is
  :mod:`pytest_mps.environment`'s; the ``--mps-report`` JSON (and so the
  audit's report) and the benchmark JSON take it; the junit XML gets it here,
  as ``<properties>`` of the test suite, named ``pytest_mps.machine.<field>``.
- A virtual GPU (:mod:`.virtual`): a header line, ``--mps-virtual-gpu``'s
  skips, and the MPS cache emptied after each test (``--mps-empty-cache``).

Only a run that asks for pytest-mps reads the machine: this front door (the
options) registers :mod:`.hooks` then.
"""

from __future__ import annotations

import pytest

from pytest_mps import ownership
from pytest_mps.machine import virtual

HOOKS = "pytest_mps.machine.hooks"


def pytest_addoption(parser: pytest.Parser) -> None:
    from pytest_mps.options import argparse_check

    group = parser.getgroup("mps")
    for flag, parse, text in (
        ("--mps-virtual-gpu", virtual.parse_policy, virtual.VIRTUAL_HELP),
        ("--mps-probe-timeout", virtual.parse_timeout, virtual.PROBE_HELP),
        ("--mps-empty-cache", virtual.parse_empty_cache, virtual.EMPTY_CACHE_HELP),
    ):
        name = flag[2:].replace("-", "_")
        group.addoption(
            flag,
            dest=name,
            metavar="VALUE",
            default=None,
            type=argparse_check(parse, flag),
            help=text,
        )
        parser.addini(name, text, default=None)


# startup.py calls this last: after devices.py has resolved the devices
def pytest_configure(config: pytest.Config) -> None:
    # every value checked where it is read, whether or not MPS is in the run
    virtual.policy(config)
    virtual.setting(config, "mps_probe_timeout", virtual.parse_timeout, 0.0)
    virtual.setting(config, "mps_empty_cache", virtual.parse_empty_cache, "auto")
    from pytest_mps.devices import devices_key

    if ownership.opted_in(config) or "mps" in config.stash.get(devices_key, []):
        ownership.register_hooks(config, HOOKS)
