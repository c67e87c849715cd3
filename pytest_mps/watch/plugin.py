"""The watching family's front door: options, markers, and asking for the rest.

The only module of the family that pytest loads at start-up. It registers the
watchers (:mod:`.fallback`, :mod:`.mixed_devices`, :mod:`.host_sync`,
:mod:`.memory`, with :mod:`.findings`) when the session asks for them (an
option or ini setting) or a collected test does (a marker or fixture of
theirs), and with them :mod:`.hooks`, which runs a test's call phase inside one
watch mode (:mod:`.mode`) and gathers the findings for the summary. A suite
that asks for none of them imports none of them. The audit registers
:mod:`.hooks` too, as does a ``pytest_mps_watch_ops`` of the project's own and
pytest-xdist's controller (the rows workers send).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import pytest

from pytest_mps import ownership, watch
from pytest_mps.options import argparse_type
from pytest_mps.watch import settings

if TYPE_CHECKING:
    from pytest_mps.watch.memory import MemoryUsage

HOOKS = "pytest_mps.watch.hooks"


@pytest.fixture
def mps_memory(request: pytest.FixtureRequest) -> MemoryUsage:
    """The test body's device memory, filled in when the test's call ends.

    Requesting it measures the test as ``@pytest.mark.mps_memory()`` does,
    without a budget; on CPU ``measured`` is False.
    """
    from pytest_mps.watch import memory

    usage: MemoryUsage | None = request.node.stash.get(memory.usage_key, None)
    if usage is None:
        usage = memory.MemoryUsage("cpu", False)
    return usage


_WATCHERS = ("fallback", "mixed_devices", "host_sync", "memory")
#: The names of the watcher modules registered in this session.
_registered_key: pytest.StashKey[set[str]] = pytest.StashKey()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup(ownership.GROUP)
    group.addoption(
        "--mps-fallback",
        dest="mps_fallback",
        type=argparse_type(settings.parse_mode, "--mps-fallback"),
        metavar="{error,warn,off}",
        default=None,
        help=settings.FALLBACK_HELP,
    )
    group.addoption(
        "--mps-mixed-devices",
        dest="mps_mixed_devices",
        type=argparse_type(settings.parse_mode, "--mps-mixed-devices"),
        metavar="{error,warn,off}",
        default=None,
        help=settings.MIXED_HELP,
    )
    group.addoption(
        "--mps-watch-every-op",
        dest="mps_watch_every_op",
        action="store_true",
        default=None,
        help=settings.EVERY_OP_HELP,
    )
    parser.addini("mps_fallback", settings.FALLBACK_HELP, default=None)
    parser.addini(
        "mps_allow_fallback", settings.ALLOW_HELP, type="linelist", default=[]
    )
    parser.addini("mps_mixed_devices", settings.MIXED_HELP, default=None)
    parser.addini(
        "mps_expected_host_syncs",
        settings.EXPECTED_SYNCS_HELP,
        type="linelist",
        default=[],
    )
    parser.addini(
        "mps_watch_every_op", settings.EVERY_OP_HELP, type="bool", default=False
    )


def _watcher(name: str) -> Any:
    # by sys.modules, not a package attribute: pytester's in-process runs drop
    # the modules a run imported, and a stale attribute would hold another copy
    import importlib

    return importlib.import_module(f"pytest_mps.watch.{name}")


def _register(config: pytest.Config, *names: str) -> None:
    """Register these watchers, findings and the hooks once; configure runs now."""
    ownership.register_hooks(config, HOOKS)
    done = config.stash.setdefault(_registered_key, set())
    for name in ("findings", *names):
        if name in done:
            continue
        config.pluginmanager.register(_watcher(name), f"pytest-mps-watch-{name}")
        done.add(name)


# startup.py calls this first
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    # The earliest hook that runs before conftest.py files (which often import
    # torch) are imported; torch reads the variable once, when it loads.
    if settings.fallback_mode(early_config, early=True) != "off":
        _watcher("fallback").set_up(early_config, early=True)


# startup.py calls this last: after devices.py has resolved the devices
def pytest_configure(config: pytest.Config) -> None:
    ownership.register_markers(config, *settings.MARKERS)
    # which files hold the tests' own checks (asserts): the ones pytest collects
    patterns = tuple(config.getini("python_files"))
    watch.test_files[0] = patterns or watch.DEFAULT_TEST_FILES
    config.stash[settings.expected_syncs_key] = settings.parse_expected_syncs(config)
    settings.check_allowed_fallbacks(config)
    config.stash[settings.mixed_mode_key] = mixed_mode = settings.mixed_mode(config)
    wanted = []
    if settings.fallback_mode(config) != "off" or _fallback_set_up(config):
        wanted.append("fallback")
    if mixed_mode != "off":
        wanted.append("mixed_devices")
    if wanted:
        _register(config, *wanted)
    elif config.getoption("dist", "no") != "no" and not hasattr(config, "workerinput"):
        ownership.register_hooks(config, HOOKS)  # the workers' rows


def _fallback_set_up(config: pytest.Config) -> bool:
    """True when the variable was set early: fallback must undo it at the end."""
    module = sys.modules.get("pytest_mps.watch.fallback")
    return module is not None and module.state_key in config.stash


def _wanted_by(item: pytest.Item) -> list[str]:
    found = []
    if ownership.closest_marker(item, "no_host_sync") is not None:
        found.append("host_sync")
    if ownership.closest_marker(item, "no_mixed_devices") is not None:
        found.append("mixed_devices")
    if ownership.closest_marker(item, "mps_memory") is not None or (
        "mps_memory" in getattr(item, "fixturenames", ())
    ):
        found.append("memory")
    return found


# startup.py calls this last
def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> None:
    wanted: set[str] = set()
    for item in items:
        wanted.update(_wanted_by(item))
        if len(wanted) == 3:
            break
    if wanted:
        _register(config, *sorted(wanted))
    elif config.hook.pytest_mps_watch_ops.get_hookimpls():
        # the project's own (a conftest's), or the audit's
        ownership.register_hooks(config, HOOKS)


def pytest_runtest_setup(item: pytest.Item) -> None:
    callspec = getattr(item, "callspec", None)
    device = callspec.params.get("device") if callspec is not None else None
    if device is None:
        from pytest_mps.devices import devices_key

        device = (item.config.stash.get(devices_key, None) or ["cpu"])[0]
    settings.running_on_cpu[0] = str(device) == "cpu"
    settings.expected_syncs[0] = item.config.stash.get(settings.expected_syncs_key, ())


# startup.py calls this from its pytest_runtest_makereport wrapper
def note_report(call: pytest.CallInfo[None], report: pytest.TestReport) -> None:
    """A missing MPS kernel's failure gets one line naming the ways out."""
    if call.when != "call" or call.excinfo is None:
        return
    if not call.excinfo.errisinstance(NotImplementedError):
        return
    text = str(call.excinfo.value)
    if "is not currently implemented for the MPS device" in text:
        from pytest_mps.watch.fallback import not_implemented_note

        note = not_implemented_note(text)
        if note is not None:
            report.sections.append(("pytest-mps fallback", note))


def pytest_unconfigure(config: pytest.Config) -> None:
    watch.test_files[0] = watch.DEFAULT_TEST_FILES
    # PYTORCH_ENABLE_MPS_FALLBACK was set early, but a usage error in
    # pytest_configure (--device mps:1) came before the fallback watcher was
    # registered to put it back: do it here.
    if _fallback_set_up(config) and "fallback" not in config.stash.get(
        _registered_key, set()
    ):
        _watcher("fallback").pytest_unconfigure(config)
