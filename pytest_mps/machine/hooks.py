"""The machine's hooks and readings, registered by :mod:`.plugin` once a run asks.

A run asks with any option of pytest-mps (then the junit XML gets the
fingerprint) or by running on mps (virtual GPUs, the cache emptied).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest

from pytest_mps import ownership
from pytest_mps.machine import virtual
from pytest_mps.machine.cache import Emptier, before_key, emptier_key

if TYPE_CHECKING:
    from pytest_mps.machine.fingerprint import Fingerprint

#: The prefix of the junit properties.
PROPERTY_PREFIX = "pytest_mps.machine."


class Verdict(NamedTuple):
    """What the session found of its MPS device, read once."""

    #: the signs of a virtual GPU (empty: none, or no MPS in the session)
    signs: tuple[str, ...]
    #: why the cache is emptied after each test, or None
    empty_cache: str | None
    #: the probe's op did not finish in time on a Mac with no sign of a
    #: virtual GPU: reported, not a sign (a first Metal use compiles shaders)
    slow: str | None = None


_fingerprint_key = pytest.StashKey["Fingerprint"]()
_verdict_key = pytest.StashKey[Verdict]()


def fingerprint(config: pytest.Config) -> Fingerprint:
    """The session's machine fingerprint, read once."""
    found = config.stash.get(_fingerprint_key, None)
    if found is None:
        from pytest_mps.emulate.plugin import emulated_mac
        from pytest_mps.machine import fingerprint as reader

        found = reader.read(emulated_mac(config))
        config.stash[_fingerprint_key] = found
    return found


def _runs_mps(config: pytest.Config) -> bool:
    from pytest_mps.devices import devices_key

    return "mps" in config.stash.get(devices_key, [])


def verdict(config: pytest.Config) -> Verdict:
    """The session's MPS device: virtual or not (probed once), cache emptying."""
    found = config.stash.get(_verdict_key, None)
    if found is not None:
        return found
    if not _runs_mps(config):
        found = Verdict((), None)
    else:
        machine = fingerprint(config)
        signs = virtual.signs(machine)
        timeout = virtual.setting(
            config, "mps_probe_timeout", virtual.parse_timeout, virtual.PROBE_TIMEOUT
        )
        slow = None
        if timeout > 0:
            from pytest_mps.devices import emulated
            from pytest_mps.machine.probe import probe

            failed = probe("mps", timeout, in_child=not emulated(config))
            if failed is not None and failed.slow and not signs:
                slow = failed.text
            elif failed is not None:
                signs.append(failed.text)
        mode = virtual.setting(
            config, "mps_empty_cache", virtual.parse_empty_cache, "auto"
        )
        reason = None
        if mode == "always":
            reason = "--mps-empty-cache=always"
        elif mode == "auto":
            why = virtual.small_memory(machine, bool(signs))
            reason = None if why is None else f"{why} (--mps-empty-cache=auto)"
        found = Verdict(tuple(signs), reason, slow)
    config.stash[_verdict_key] = found
    return found


def header_lines(config: pytest.Config) -> list[str]:
    """The machine's header lines: the fingerprint, and a virtual GPU's line."""
    lines = [f"pytest-mps machine: {fingerprint(config).line()}"]
    found = verdict(config)
    if found.signs:
        lines.append(
            "pytest-mps machine: "
            + virtual.describe(list(found.signs), virtual.policy(config))
        )
    if found.slow:
        lines.append(
            f"pytest-mps machine: the MPS device is slow, not virtual: {found.slow} "
            "(--mps-probe-timeout), on a Mac with no sign of a virtual GPU; the "
            "probe's process was stopped"
        )
    if found.empty_cache:
        lines.append(
            f"pytest-mps machine: the MPS cache is emptied after each test: "
            f"{found.empty_cache}"
        )
    return lines


def junit_properties(found: Fingerprint) -> list[tuple[str, str]]:
    """``(pytest_mps.machine.os_build, 24F74)``, ... for each known field."""
    pairs = []
    for name, value in found.as_dict().items():
        if value is None or value == []:
            continue
        if isinstance(value, list):
            value = "; ".join(map(str, value))
        pairs.append((PROPERTY_PREFIX + name, str(value)))
    return pairs


def _junit_writer(config: pytest.Config) -> Any | None:
    """The junitxml plugin object, when ``--junitxml`` is on (not on workers).

    Found by what it offers, ``add_global_property`` (the method pytest's own
    ``record_testsuite_property`` fixture calls), since it is registered
    without a name.
    """
    for plugin in config.pluginmanager.get_plugins():
        if callable(getattr(plugin, "add_global_property", None)) and hasattr(
            plugin, "logfile"
        ):
            return plugin
    return None


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    config = session.config
    if not ownership.opted_in(config) or hasattr(config, "workerinput"):
        return
    writer = _junit_writer(config)
    if writer is None:
        return
    for name, value in junit_properties(fingerprint(config)):
        writer.add_global_property(name, value)


def _uses_mps(item: pytest.Item) -> bool:
    """The test runs on mps: its ``device`` is, it is marked, or takes mps_device."""
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec is not None else {}
    return (
        params.get("device") == "mps"
        or ownership.closest_marker(item, "mps") is not None
        or "mps_device" in getattr(item, "fixturenames", ())
    )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> None:
    if not _runs_mps(config) or virtual.policy(config) != "skip":
        return
    found = verdict(config)
    if not found.signs:
        return
    reason = f"MPS on a virtual GPU ({'; '.join(found.signs)}): --mps-virtual-gpu=skip"
    for item in items:
        if _uses_mps(item):
            item.add_marker(pytest.mark.skip(reason=reason))


def _uses_bfloat16(item: pytest.Item) -> bool:
    """A parameter of the test is bfloat16: ``torch.bfloat16``, "bfloat16", "bf16"."""
    callspec = getattr(item, "callspec", None)
    values = callspec.params.values() if callspec is not None else ()
    return any(str(v) in ("torch.bfloat16", "bfloat16", "bf16") for v in values)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # a bfloat16 kernel on a GPU without Metal's bfloat can abort the whole
    # process (exit 134 on hosted runners' Apple5 GPU: qvac#3775): skip first
    config = item.config
    emptier = _emptier(config)
    if emptier is not None:
        item.stash[before_key] = emptier.before()
    if not _runs_mps(config) or not _uses_mps(item) or not _uses_bfloat16(item):
        return
    found = fingerprint(config)
    if found.bfloat16 is False and found.emulated is None:
        pytest.skip(
            f"bfloat16 on MPS: the GPU ({found.gpu}, MTLGPUFamilyApple"
            f"{found.gpu_family}) has no bfloat16 (Metal's bfloat needs Apple6, "
            "Apple's Metal feature set tables); its kernels can abort the process"
        )


def _emptier(config: pytest.Config) -> Emptier | None:
    """The session's cache emptying, where it empties (made once)."""
    found = config.stash.get(emptier_key, None)
    if found is None and _runs_mps(config):
        reason = verdict(config).empty_cache
        if reason:
            found = config.stash[emptier_key] = Emptier(reason)
    return found


def pytest_collection_finish(session: pytest.Session) -> None:
    emptier = _emptier(session.config)
    if emptier is not None:
        emptier.freeze()


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    try:
        return (yield)
    finally:
        emptier = _emptier(item.config)
        if emptier is not None:
            emptier.after(item.stash.get(before_key, None))


def pytest_sessionfinish(session: pytest.Session) -> None:
    emptier = session.config.stash.get(emptier_key, None)
    if emptier is not None:
        emptier.unfreeze()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    emptier = config.stash.get(emptier_key, None)
    if emptier is not None and emptier.emptied:
        terminalreporter.write_line(emptier.summary())
