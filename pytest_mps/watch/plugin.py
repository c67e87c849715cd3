"""The test's one watch mode: ``--mps-watch-every-op`` and the call-phase wrapper.

Asks every ``pytest_mps_watch_ops`` implementation for a callback; when one
returns a callback, the test's call phase runs inside one watch mode
(:mod:`pytest_mps.watch.mode`, imported only then).
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

from pytest_mps.watch import OpCallback

EVERY_OP_HELP = (
    "watch every aten op of a watched test: no skipping of calls known to be "
    "clean (F.linear on one device, ...), at several us per op"
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mps")
    group.addoption(
        "--mps-watch-every-op",
        dest="mps_watch_every_op",
        action="store_true",
        default=None,
        help=EVERY_OP_HELP,
    )
    parser.addini("mps_watch_every_op", EVERY_OP_HELP, type="bool", default=False)


def _every_op(config: pytest.Config) -> bool:
    value = config.getoption("mps_watch_every_op")
    return bool(config.getini("mps_watch_every_op") if value is None else value)


def _callbacks_for(item: pytest.Item) -> list[OpCallback]:
    found = item.ihook.pytest_mps_watch_ops(item=item)
    return [callback for callback in found if callback is not None]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    callbacks = _callbacks_for(item)
    if not callbacks:
        return (yield)
    from pytest_mps.watch.mode import watching

    with watching(callbacks, every_op=_every_op(item.config)):
        return (yield)
