"""Choosing devices: ``--device`` / ``--mps``, the ``device`` fixture, markers."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pytest

from pytest_mps import flags, ownership
from pytest_mps.options import closest

if TYPE_CHECKING:
    import torch

    from pytest_mps.parity.check import DeviceParity

DEVICE_HELP = (
    "run tests that take the 'device' fixture on DEV: cpu, mps, cuda, cuda:N, or "
    "auto (best available: mps > cuda > cpu). Repeat for several devices. "
    "Default: cpu."
)
MPS_HELP = "run on the Apple GPU (shorthand for --device mps); stop if MPS is unusable."

#: The devices chosen for this session, canonical ids (``cpu``, ``mps``, ``cuda:0``).
devices_key: pytest.StashKey[list[str]] = pytest.StashKey()

# compiled on first use (re's cache): 50 us of every start-up otherwise
_SPEC = r"^(cpu|mps|cuda|auto)(?::(\d+))?$"


def parse_device(value: str, where: str) -> str:
    """Validate one device spec and return its session id.

    ``mps`` and ``mps:0`` are one device (id ``mps``); ``cuda`` is ``cuda:0``.
    Raises ValueError naming ``where`` the value came from.
    """
    prefix = f"{where}: " if where else ""
    text = value.strip().lower()
    if text in ("cpu", "auto", "mps"):
        return text
    match = re.match(_SPEC, text)
    if match is None:
        kind = text.partition(":")[0]
        meant = closest(kind, ("cpu", "mps", "cuda", "auto"))
        hint = f"did you mean {meant!r}? " if meant else ""
        if kind == "gpu":  # closest to "cpu", the one it is not
            hint = "a GPU is mps or cuda; "
        raise ValueError(
            f"{prefix}{value!r} is not a device; {hint}use cpu, mps, cuda, cuda:N "
            "or auto"
        )
    kind, index = match.group(1), match.group(2)
    if kind in ("cpu", "auto"):
        if index is not None:
            raise ValueError(f"{prefix}{value!r}: {kind} takes no index")
        return kind
    if kind == "mps":
        if index not in (None, "0"):
            raise ValueError(f"{prefix}{value!r}: MPS has one device, mps:0")
        return "mps"
    return f"cuda:{index or 0}"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup(
        ownership.GROUP, "pytest-mps: PyTorch devices, timing and hygiene"
    )
    # No type= here: a project's own --device is read with ours in place once
    # (before its conftest.py adds it), and its values must not be refused by
    # our parser then. The values are checked in pytest_configure, naming the flag.
    # On a pytest whose parser we do not know, the unprefixed flags are left
    # out: a project's own --device could not be yielded to (flags.py).
    short = flags.short_flags_allowed(parser)
    group.addoption(
        *(("--device",) if short else ()),
        "--mps-device",
        action="append",
        dest="mps_devices",
        metavar="DEV",
        default=None,
        help=DEVICE_HELP,
    )
    if short:
        group.addoption(
            "--mps", action="store_true", dest="mps_only", default=False, help=MPS_HELP
        )
    parser.addini("mps_devices", DEVICE_HELP, type="linelist", default=[])


@pytest.hookimpl(trylast=True)
def pytest_mps_auto_device(config: pytest.Config) -> str | None:
    import torch

    from pytest_mps import backend

    if backend.mps_built() and backend.mps_available():
        return "mps"
    if torch.cuda.is_available():
        # without starting CUDA here (see accelerator.canonical): device 0 then
        index = torch.cuda.current_device() if torch.cuda.is_initialized() else 0  # type: ignore[no-untyped-call]
        return f"cuda:{index}"
    return "cpu"


def _requested(config: pytest.Config) -> tuple[list[str], str]:
    """The device ids asked for, and where they came from (for error messages)."""
    flag = "--device"
    given = [str(a) for a in config.invocation_params.args]
    if flags.flag_yielded(config, "--device") or any(
        a == "--mps-device" or a.startswith("--mps-device=") for a in given
    ):
        flag = "--mps-device"
    try:
        cli = [parse_device(v, flag) for v in config.getoption("mps_devices") or []]
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    if config.getoption("mps_only", False):
        return (["mps", *[d for d in cli if d != "mps"]], "--mps")
    if emulated(config):
        return (["mps", *[d for d in cli if d != "mps"]], "--mps-emulate")
    if cli:
        return cli, flag
    ini_values: list[str] = config.getini("mps_devices")
    if ini_values:
        where = f"ini option mps_devices in {config.inipath}"
        try:
            return [parse_device(v, where) for v in ini_values], where
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
    return ["cpu"], "default"


def emulated(config: pytest.Config) -> bool:
    """True when the run asks for the emulated MPS device (``--mps-emulate``)."""
    value = config.getoption("mps_emulate", None)
    if value is None:
        value = getattr(config.known_args_namespace, "mps_emulate", None)
    if value is None:
        value = ini_flag(config, "mps_emulate")
    if not value:
        from pytest_mps.machine import virtual

        # --mps-virtual-gpu=emulate on a virtual GPU
        return virtual.emulates(config)
    return bool(value)


def ini_flag(config: pytest.Config, name: str) -> bool:
    """A boolean ini setting; a value that is not one is a usage error naming it.

    An unregistered key (its family blocked with ``-p no:...``) reads False.
    """
    try:
        return bool(config.getini(name))
    except (ValueError, pytest.UsageError) as exc:  # pytest 9 raises the latter
        if "unknown configuration value" in str(exc):
            return False
        raise pytest.UsageError(
            f"ini option {name} in {config.inipath}: {exc}; use true or false"
        ) from None


def check_usable(device: str, where: str) -> None:
    """Raise a UsageError naming ``where`` when ``device`` cannot be used here."""
    if device == "cpu":
        return
    from pytest_mps import backend  # here: a run on the CPU never needs it

    where = where if where in ("--mps", "--mps-emulate") else f"{where} {device}"
    if device == "mps":
        reason = backend.mps_unavailable_reason()
        if reason is not None:
            raise pytest.UsageError(
                f"{where}: MPS cannot be used: {reason}. To run the mps cases "
                "on this machine, add --mps-emulate (the emulated device fails "
                "where a Mac fails)"
            )
        return
    if device.startswith("cuda"):
        if not backend.torch_installed():
            raise pytest.UsageError(f"{where}: torch is not installed")
        import torch

        if not torch.cuda.is_available():
            raise pytest.UsageError(
                f"{where}: CUDA is not available "
                f"(torch {torch.__version__}, torch.cuda.is_available() is False)"
            )
        index = int(device.split(":")[1])
        count = torch.cuda.device_count()
        if index >= count:
            raise pytest.UsageError(f"{where}: only {count} CUDA device(s) are visible")


def resolve_devices(config: pytest.Config) -> list[str]:
    """Turn the options into the session's device ids; UsageError when unusable."""
    requested, where = _requested(config)
    resolved: list[str] = []
    for device in requested:
        if device == "auto":
            from pytest_mps import backend

            if not backend.torch_installed():
                raise pytest.UsageError(f"{where} auto: torch is not installed")
            device = config.hook.pytest_mps_auto_device(config=config)
            device = parse_device(str(device), "pytest_mps_auto_device")
        check_usable(device, where)
        if device not in resolved:
            resolved.append(device)
    return resolved


MARKERS = (
    "mps: the test needs the MPS device; skipped unless the session runs "
    "with --mps on an Apple-silicon Mac.",
    "skip_device(*devices, reason=None): skip the test on these devices "
    "(cpu, mps, cuda, cuda:N).",
    "xfail_device(*devices, reason=None, strict=False): expect the test to "
    "fail on these devices.",
    "devices(*devices): run the test's 'device' parametrization only on these "
    "of the session's devices.",
)


def pytest_configure(config: pytest.Config) -> None:
    ownership.register_markers(config, *MARKERS)
    config.stash[devices_key] = resolve_devices(config)


# -- markers --------------------------------------------------------------------


class DeviceMark:
    """One parsed ``skip_device`` / ``xfail_device`` / ``devices`` marker.

    A plain class: a NamedTuple costs 0.3 ms at every pytest start-up.
    """

    __slots__ = ("devices", "name", "reason", "strict")

    def __init__(
        self,
        name: str,
        devices: frozenset[str],
        reason: str | None = None,
        strict: bool = False,
    ) -> None:
        self.name = name
        self.devices = devices
        self.reason = reason
        self.strict = strict

    def matches(self, device: str) -> bool:
        """True when the marker names ``device`` (``cuda`` names every CUDA device)."""
        return device in self.devices or (
            device.startswith("cuda:") and "cuda" in self.devices
        )


def _parse_mark(mark: pytest.Mark, nodeid: str) -> DeviceMark:
    where = f"@pytest.mark.{mark.name} on {nodeid}"
    allowed = {"skip_device": {"reason"}, "xfail_device": {"reason", "strict"}}
    extra = set(mark.kwargs) - allowed.get(mark.name, set())
    if extra:
        raise ValueError(f"{where}: unexpected argument(s) {sorted(extra)}")
    if not mark.args:
        raise ValueError(f"{where}: name at least one device")
    names: set[str] = set()
    for arg in mark.args:
        if not isinstance(arg, str):
            raise ValueError(f"{where}: {arg!r} is not a device name")
        if arg.strip().lower() == "cuda":
            names.add("cuda")
            continue
        device = parse_device(arg, where)
        if device == "auto":
            raise ValueError(f"{where}: 'auto' is not allowed in a marker")
        names.add(device)
    reason = mark.kwargs.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise ValueError(f"{where}: reason must be a string, got {reason!r}")
    strict = mark.kwargs.get("strict", False)
    if not isinstance(strict, bool):
        raise ValueError(f"{where}: strict must be True or False, got {strict!r}")
    return DeviceMark(mark.name, frozenset(names), reason, strict)


_DEVICE_MARKS = ("skip_device", "xfail_device", "devices")


def _device_marks(
    config: pytest.Config, marks: Iterable[pytest.Mark], nodeid: str
) -> list[DeviceMark]:
    ours = {n for n in _DEVICE_MARKS if ownership.marker_is_ours(config, n)}
    return [_parse_mark(m, nodeid) for m in marks if m.name in ours]


def _parametrizes_device_itself(metafunc: pytest.Metafunc) -> bool:
    """True when the test's own parametrize marks name ``device``."""
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0] if mark.args else mark.kwargs.get("argnames", "")
        if isinstance(names, str):
            names = [n.strip() for n in names.split(",")]
        if "device" in names:
            return True
    return False


@pytest.hookimpl(trylast=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # trylast: the project's own parametrization of 'device' (marks, its own
    # pytest_generate_tests, indirect) comes first, and then ours steps aside.
    if "device" not in metafunc.fixturenames:
        return
    if not ownership.fixture_is_ours(metafunc, "device", device):
        return  # the project's own 'device' fixture: its parametrization, not ours
    if _parametrizes_device_itself(metafunc):
        return
    session_devices = metafunc.config.stash[devices_key]
    chosen = list(session_devices)
    try:
        marks = _device_marks(
            metafunc.config,
            metafunc.definition.iter_markers(),
            metafunc.definition.nodeid,
        )
    except ValueError:
        marks = []  # reported when the test is set up, naming marker and test
    for mark in marks:
        if mark.name == "devices":
            chosen = [d for d in chosen if mark.matches(d)]
    if chosen:
        try:
            metafunc.parametrize("device", chosen, ids=chosen, indirect=True)
        except (pytest.Collector.CollectError, ValueError) as exc:
            # pytest < 8.4 raises ValueError for it
            if "duplicate parametrization" not in str(exc):
                raise
            # the project's own pytest_generate_tests parametrized 'device'
        return
    wanted = sorted(set().union(*(m.devices for m in marks if m.name == "devices")))
    reason = (
        f"restricted by @pytest.mark.devices to {', '.join(wanted)}; this session "
        f"runs on {', '.join(session_devices)}"
    )
    metafunc.parametrize(
        "device",
        [pytest.param(None, marks=pytest.mark.skip(reason=reason), id="no-device")],
        indirect=True,
    )


def _test_devices(item: pytest.Item) -> list[str]:
    session: list[str] = item.config.stash[devices_key]
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "device" in callspec.params:
        param = callspec.params["device"]
        return [param] if param is not None else []
    return list(session)


mark_error_key: pytest.StashKey[str] = pytest.StashKey()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        try:
            marks = _device_marks(item.config, item.iter_markers(), item.nodeid)
        except ValueError as exc:
            item.stash[mark_error_key] = str(exc)
            continue
        session_devices = item.config.stash[devices_key]
        mps_mark = ownership.closest_marker(item, "mps")
        if mps_mark is not None and "mps" not in session_devices:
            item.add_marker(
                pytest.mark.skip(
                    reason="needs MPS: run with --mps on an Apple-silicon Mac "
                    f"(this session runs on {', '.join(session_devices)})"
                )
            )
        for device in _test_devices(item):
            for mark in marks:
                if not mark.matches(device):
                    continue
                if mark.name == "skip_device":
                    reason = mark.reason or f"skipped on {device}"
                    item.add_marker(pytest.mark.skip(reason=reason))
                elif mark.name == "xfail_device":
                    reason = mark.reason or f"expected to fail on {device}"
                    item.add_marker(
                        pytest.mark.xfail(reason=reason, strict=mark.strict)
                    )


# startup.py calls this first
def pytest_runtest_setup(item: pytest.Item) -> None:
    error = item.stash.get(mark_error_key, None)
    if error is not None:
        pytest.fail(error, pytrace=False)


# -- fixtures -------------------------------------------------------------------


@pytest.fixture
def device(request: pytest.FixtureRequest) -> torch.device:
    """The test's ``torch.device``, one per device chosen with ``--device``/``--mps``.

    Tests that take it run once per device, with ids ``[cpu]``, ``[mps]``,
    ``[cuda:0]``.
    """
    import torch

    name: Any = getattr(request, "param", None)
    if name is None:
        name = request.config.stash[devices_key][0]
    return torch.device(name)


@pytest.fixture
def device_parity(device: Any) -> DeviceParity:
    """``assert_device_parity`` bound to the test's device.

    ``device_parity(model, x)`` copies ``model`` and ``x`` to the CPU and to the
    test's ``device``, runs forward, backward (and ``steps=N`` optimizer steps)
    on both with the same seeds, and fails with a table of every output,
    gradient and parameter out of tolerance, named by its path. It takes
    :func:`pytest_mps.assert_device_parity`'s keyword arguments but ``device``,
    and returns its report.
    """
    from pytest_mps.parity.check import DeviceParity

    return DeviceParity(device)


@pytest.fixture
def mps_device(request: pytest.FixtureRequest) -> torch.device:
    """``torch.device("mps")``; skips the test when the session is not on MPS."""
    session_devices = request.config.stash[devices_key]
    if "mps" not in session_devices:
        pytest.skip(
            "mps_device needs MPS: run with --mps on an Apple-silicon Mac "
            f"(this session runs on {', '.join(session_devices)})"
        )
    import torch

    return torch.device("mps")
