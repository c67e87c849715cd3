"""The benchmark options: flags, their ini twins, validation, and the settings.

Light on purpose (the start-up imports it): the timer, storage and fixture
import from here, never the other way round.

Precedence: marker > command line > ini. A bad value is an argparse error
naming the flag, or a usage error naming the ini option and its file.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from pytest_mps import devices as session_devices
from pytest_mps.options import argparse_check

#: The name of a test's measurements on ``report.user_properties``.
PROPERTY = "mps_benchmark"
STATS = ("min", "max", "mean", "median")
_FAIL_EXPR = re.compile(r"^(min|max|mean|median):(\d+(?:\.\d*)?|\.\d+)(%?)$")

ONLY_HELP = "run only the tests that use the mps_benchmark fixture."
SKIP_HELP = "skip the tests that use the mps_benchmark fixture."
JSON_HELP = "write the benchmarks to PATH in pytest-benchmark's JSON schema."
SAVE_HELP = "save the run as STORAGE/<machine key>/NNNN_NAME.json."
AUTOSAVE_HELP = "save every run as STORAGE/<machine key>/NNNN_<commit>_<time>.json."
COMPARE_HELP = (
    "compare with a saved run of this machine: its number (0003), part of its "
    "name, or a file path; alone, the latest."
)
COMPARE_FAIL_HELP = (
    "fail the session when a benchmark is slower than the compared run by more "
    "than STAT:N% or STAT:SECONDS (STAT: min, max, mean, median). Repeatable."
)
DEVICES_HELP = (
    "time each benchmark that takes the 'device' fixture on each of these "
    "devices (e.g. cpu,mps or cpu,cuda) and print a speedup table."
)
STORAGE_HELP = "folder of saved runs. Default: .benchmarks in the rootdir."
MIN_TIME_HELP = (
    "shortest round, in seconds (default 0.000005); a round also outlasts 100 "
    "device syncs and 100 clock steps."
)
MAX_TIME_HELP = (
    "time budget per benchmark for warmup and for rounds, in seconds (default 1)."
)
WARMUP_HELP = (
    "warmup: 'auto' (until stable, the default), a number of rounds, or 'off'."
)


class Settings(NamedTuple):
    """What a measurement may spend; the fixture fills it from marker and options."""

    warmup: bool | int = True
    rounds: int | None = None
    iterations: int | None = None
    min_time: float = 5e-6
    max_time: float = 1.0
    min_rounds: int = 5
    #: Consecutive warmup windows whose medians differ by less than this are stable.
    stable_tolerance: float = 0.05
    #: Device events and wall time further apart than this disagree.
    events_tolerance: float = 0.10


class FailExpr(NamedTuple):
    """``median:10%`` (relative) or ``min:0.001`` (absolute seconds)."""

    stat: str
    amount: float
    percent: bool

    def __str__(self) -> str:
        return f"{self.stat}:{self.amount:g}{'%' if self.percent else ''}"

    def regression(self, current: float, baseline: float) -> str | None:
        """A description of the slowdown when it passes the threshold, else None."""
        change = current - baseline
        limit = baseline * self.amount / 100 if self.percent else self.amount
        if change <= limit:
            return None
        pct = change / baseline * 100 if baseline else float("inf")
        return (
            f"{self.stat} {current * 1e6:.4g} us vs {baseline * 1e6:.4g} us "
            f"(+{pct:.1f}%, limit {self})"
        )


def parse_fail_expr(text: str, where: str) -> FailExpr:
    """Parse one compare-fail expression; ValueError naming ``where`` otherwise."""
    match = _FAIL_EXPR.match(text.strip())
    if match is None:
        raise ValueError(
            f"{where}: {text!r} is not a threshold; use STAT:N% or STAT:SECONDS "
            f"with STAT one of {', '.join(STATS)} (e.g. median:10%)"
        )
    return FailExpr(match.group(1), float(match.group(2)), bool(match.group(3)))


class BenchmarkOptions(NamedTuple):
    """The session's benchmark options, validated once."""

    only: bool
    skip: bool
    json: Path | None
    save: str | None
    autosave: bool
    compare: str | None
    compare_fail: tuple[FailExpr, ...]
    devices: tuple[str, ...]
    storage: Path
    settings: Settings


# -- values -----------------------------------------------------------------------


def parse_seconds(value: str, where: str) -> float:
    """A positive number of seconds; ValueError naming ``where`` otherwise."""
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"{where}: {value!r} is not a number of seconds") from None
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"{where}: {value!r} must be a positive number of seconds")
    return seconds


def parse_warmup(value: str, where: str) -> bool | int:
    """``auto`` -> True, ``off`` -> False, ``N`` -> N rounds."""
    text = value.strip().lower()
    if text in ("auto", "on", "true"):
        return True
    if text in ("off", "false", "0"):
        return False
    if text.isdigit():
        return int(text)
    raise ValueError(f"{where}: {value!r} is not 'auto', 'off' or a number of rounds")


def parse_device_list(value: str, where: str) -> tuple[str, ...]:
    """``cpu,mps`` -> ``("cpu", "mps")``, each a device id of the session."""
    names = [v for v in value.replace(" ", ",").split(",") if v]
    if not names:
        raise ValueError(f"{where}: name at least one device")
    found: list[str] = []
    for name in names:
        device = session_devices.parse_device(name, where)
        if device == "auto":
            raise ValueError(f"{where}: 'auto' is not allowed here; name devices")
        if device not in found:
            found.append(device)
    return tuple(found)


def parse_compare_run(value: str, where: str) -> str:
    """Refuse a test path that argparse took as the optional RUN after the flag."""
    if not value:
        return value  # the bare flag: compare with the latest run
    path = Path(value)
    if path.suffix == ".py" or path.is_dir() or "::" in value:
        raise ValueError(
            f"{where}: {value!r} is a test path, not a saved run; write "
            f"{where}=RUN, or put {where} after the paths"
        )
    return value


def add_options(parser: pytest.Parser) -> None:
    """Add the flags to the plugin's group and their ini twins."""
    group = parser.getgroup("mps")
    add = group.addoption
    add("--mps-benchmark-only", action="store_true", default=False, help=ONLY_HELP)
    add("--mps-benchmark-skip", action="store_true", default=False, help=SKIP_HELP)
    add("--mps-benchmark-json", metavar="PATH", default=None, help=JSON_HELP)
    add("--mps-benchmark-save", metavar="NAME", default=None, help=SAVE_HELP)
    add(
        "--mps-benchmark-autosave",
        action="store_true",
        default=None,
        help=AUTOSAVE_HELP,
    )
    add(
        "--mps-benchmark-compare",
        metavar="RUN",
        nargs="?",
        const="",
        default=None,
        type=argparse_check(parse_compare_run, "--mps-benchmark-compare"),
        help=COMPARE_HELP,
    )
    add(
        "--mps-benchmark-compare-fail",
        metavar="EXPR",
        action="append",
        default=None,
        type=argparse_check(parse_fail_expr, "--mps-benchmark-compare-fail"),
        help=COMPARE_FAIL_HELP.replace("%", "%%"),  # argparse formats help with %
    )
    add(
        "--mps-benchmark-devices",
        metavar="DEVS",
        default=None,
        type=argparse_check(parse_device_list, "--mps-benchmark-devices"),
        help=DEVICES_HELP,
    )
    add("--mps-benchmark-storage", metavar="PATH", default=None, help=STORAGE_HELP)
    for flag, parse, text in (
        ("--mps-benchmark-min-time", parse_seconds, MIN_TIME_HELP),
        ("--mps-benchmark-max-time", parse_seconds, MAX_TIME_HELP),
        ("--mps-benchmark-warmup", parse_warmup, WARMUP_HELP),
    ):
        add(
            flag,
            metavar="VALUE",
            default=None,
            type=argparse_check(parse, flag),
            help=text,
        )
    parser.addini("mps_benchmark_autosave", AUTOSAVE_HELP, type="bool", default=False)
    parser.addini(
        "mps_benchmark_compare_fail", COMPARE_FAIL_HELP, type="linelist", default=[]
    )  # noqa: E501
    for name, text in (
        ("mps_benchmark_devices", DEVICES_HELP),
        ("mps_benchmark_storage", STORAGE_HELP),
        ("mps_benchmark_min_time", MIN_TIME_HELP),
        ("mps_benchmark_max_time", MAX_TIME_HELP),
        ("mps_benchmark_warmup", WARMUP_HELP),
    ):
        parser.addini(name, text, default=None)


def _setting(config: pytest.Config, name: str, parse: Callable[[str, str], Any]) -> Any:
    """An option's value, command line over ini, validated naming its source."""
    value = config.getoption(name)
    where = "--" + name.replace("_", "-")
    if value is None:
        value = config.getini(name)
        where = f"ini option {name} in {config.inipath}"
    if value is None or value == "":
        return None
    try:
        return parse(str(value), where)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def read_options(config: pytest.Config) -> BenchmarkOptions:
    """Validate the options and ini values; UsageError naming the culprit."""
    only, skip = (
        config.getoption("mps_benchmark_only"),
        config.getoption("mps_benchmark_skip"),
    )
    if only and skip:
        raise pytest.UsageError(
            "--mps-benchmark-only and --mps-benchmark-skip contradict each other"
        )
    exprs = config.getoption("mps_benchmark_compare_fail")
    where = "--mps-benchmark-compare-fail"
    if not exprs:
        exprs = config.getini("mps_benchmark_compare_fail")
        where = f"ini option mps_benchmark_compare_fail in {config.inipath}"
    try:
        fail = tuple(parse_fail_expr(e, where) for e in exprs)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    autosave = config.getoption("mps_benchmark_autosave")
    if autosave is None:
        autosave = bool(config.getini("mps_benchmark_autosave"))
    storage = config.getoption("mps_benchmark_storage") or config.getini(
        "mps_benchmark_storage"
    )
    defaults = Settings()
    min_time = _setting(config, "mps_benchmark_min_time", parse_seconds)
    max_time = _setting(config, "mps_benchmark_max_time", parse_seconds)
    warmup = _setting(config, "mps_benchmark_warmup", parse_warmup)
    json_path = config.getoption("mps_benchmark_json")
    return BenchmarkOptions(
        only=bool(only),
        skip=bool(skip),
        json=Path(json_path) if json_path else None,
        save=config.getoption("mps_benchmark_save"),
        autosave=autosave,
        compare=config.getoption("mps_benchmark_compare"),
        compare_fail=fail,
        devices=_setting(config, "mps_benchmark_devices", parse_device_list) or (),
        storage=Path(config.rootpath, storage or ".benchmarks"),
        settings=defaults._replace(
            min_time=min_time or defaults.min_time,
            max_time=max_time or defaults.max_time,
            warmup=defaults.warmup if warmup is None else warmup,
        ),
    )
