"""The ``seed`` fixture: seeded Python, NumPy, torch and device generators per test."""

from __future__ import annotations

import sys
import zlib
from collections.abc import Generator

import pytest

from pytest_mps.options import argparse_check

SEED_HELP = (
    "seed for the 'seed' fixture: an integer for every test, or 'random' for a "
    "fresh one per session. Default: derived from each test's id, so reruns repeat."
)

seed_key: pytest.StashKey[int] = pytest.StashKey()
_MAX_SEED = 2**32 - 1


def parse_seed(value: str, where: str) -> int | None:
    """An integer seed, None for 'random'; ValueError naming ``where`` otherwise."""
    text = value.strip()
    if text.lower() == "random":
        return None
    try:
        seed = int(text, 0)
    except ValueError:
        raise ValueError(
            f"{where}: {value!r} is not a seed; use an integer or 'random'"
        ) from None
    if not 0 <= seed <= _MAX_SEED:
        raise ValueError(f"{where}: {value!r} is outside 0..{_MAX_SEED}")
    return seed


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mps")
    group.addoption(
        "--mps-seed",
        dest="mps_seed",
        type=argparse_check(parse_seed, "--mps-seed"),
        metavar="N",
        help=SEED_HELP,
    )
    parser.addini("mps_seed", SEED_HELP, default=None)


_session_seed_key: pytest.StashKey[int | None] = pytest.StashKey()


def pytest_configure(config: pytest.Config) -> None:
    value = config.getoption("mps_seed")
    where = "--mps-seed"
    if value is None:
        value = config.getini("mps_seed")
        where = f"ini option mps_seed in {config.inipath}"
    fixed: int | None = None
    if value:
        try:
            fixed = parse_seed(str(value), where)
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
        if fixed is None:
            import random  # 1 ms at every start-up if imported above

            fixed = random.SystemRandom().randint(0, _MAX_SEED)
    config.stash[_session_seed_key] = fixed


def seed_for(config: pytest.Config, nodeid: str) -> int:
    """The seed a test gets: the fixed one, else a stable hash of its id."""
    fixed = config.stash.get(_session_seed_key, None)
    return fixed if fixed is not None else zlib.crc32(nodeid.encode())


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> Generator[int]:
    """Seed Python's ``random``, NumPy (if installed), torch and the test's device.

    Returns the seed. It is printed when the test fails, with the option that
    repeats it; the generators' previous states are restored after the test.
    """
    import random

    import torch

    value = seed_for(request.config, request.node.nodeid)
    request.node.stash[seed_key] = value
    py_state = random.getstate()
    torch_state = torch.random.get_rng_state()
    np_random = sys.modules.get("numpy.random")
    if np_random is None:
        try:
            import numpy.random as np_random
        except ImportError:
            np_random = None
    np_state = np_random.get_state() if np_random is not None else None
    random.seed(value)
    if np_random is not None:
        np_random.seed(value)
    # torch.manual_seed seeds the CPU generator and every CUDA and MPS device too.
    torch.manual_seed(value)
    try:
        yield value
    finally:
        random.setstate(py_state)
        torch.random.set_rng_state(torch_state)
        if np_random is not None and np_state is not None:
            np_random.set_state(np_state)


# startup.py calls this from its pytest_runtest_makereport wrapper
def note_report(item: pytest.Item, report: pytest.TestReport) -> None:
    """A failed test's report names its seed and how to rerun with it."""
    value = item.stash.get(seed_key, None)
    if value is not None and report.failed:
        report.sections.append(
            ("pytest-mps seed", f"seed {value}: rerun with --mps-seed={value}")
        )
