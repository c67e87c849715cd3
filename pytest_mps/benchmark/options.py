"""The benchmark options' values: parsers, the session's options, the settings.

Light on purpose (the start-up imports it): the timer, storage and fixture
import from here, never the other way round. The flags themselves, their ini
twins and their reading are in :mod:`.flags`.

Each parser takes ``(value, where)`` and raises ValueError naming ``where``
(the flag, the ini option and its file, or the marker).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_mps import devices as session_devices
from pytest_mps.options import choice, choices

#: The name of a test's measurements on ``report.user_properties``.
PROPERTY = "mps_benchmark"
STATS = ("min", "max", "mean", "median")

#: pytest-benchmark's columns, then ours.
COLUMNS: tuple[str, ...] = (
    "min", "max", "mean", "stddev", "median", "iqr", "outliers", "ops", "rounds",
    "iterations", "device", "ratio", "dispatch", "verdict", "events", "memory",
)  # fmt: skip
#: What the table shows unless --mps-benchmark-columns says otherwise.
DEFAULT_COLUMNS: tuple[str, ...] = (
    "device", "min", "max", "mean", "stddev", "median", "iqr", "outliers", "ops",
    "rounds", "iterations", "ratio", "dispatch", "verdict", "events", "memory",
)  # fmt: skip
SORTS = ("name", "fullname", "min", "max", "mean", "median", "stddev", "ops")
GROUP_BY = ("group", "name", "fullname", "func", "fullfunc", "param", "device")
NAME_FORMATS = ("short", "normal", "long")
TIME_UNITS = ("auto", "s", "ms", "us", "ns")


#: Pairs of processes of the A/B gate by default: 7 caught 92% of 10% slowdowns on
#: a quiet 2-core machine where 5 caught 88% (docs/benchmarks.md).
COMPARE_PROCESSES = 7


# -- values -----------------------------------------------------------------------

#: pytest-benchmark's --benchmark-cprofile columns.
CPROFILE_COLUMNS = (
    "ncalls_recursion",
    "ncalls",
    "tottime",
    "tottime_per",
    "cumtime",
    "cumtime_per",
    "function_name",
)


def parse_compare_machine(value: str, where: str) -> str:
    """``warn`` or ``refuse``; ValueError naming ``where`` otherwise."""
    if value.strip() not in ("warn", "refuse"):
        raise ValueError(f"{where}: {value!r} is not one of: warn, refuse")
    return value.strip()


def parse_rev(value: str, where: str) -> str:
    """A git revision (checked against the repository when the run starts)."""
    if not value.strip() or value.startswith("-"):
        raise ValueError(
            f"{where}: {value!r} is not a git revision (like main, HEAD~1)"
        )
    return value.strip()


def parse_cprofile_column(value: str, where: str) -> str:
    """One of :data:`CPROFILE_COLUMNS`; ValueError naming ``where`` otherwise."""
    if value not in CPROFILE_COLUMNS:
        raise ValueError(
            f"{where}: {value!r} is not a cprofile column "
            f"(one of {', '.join(CPROFILE_COLUMNS)})"
        )
    return value


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


def parse_rounds(value: str, where: str) -> int:
    """A whole number of rounds >= 1."""
    text = value.strip()
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{where}: {value!r} is not a number of rounds >= 1")
    return int(text)


def parse_precision(value: str, where: str) -> float:
    """``0.02`` or ``2%``: a fraction of the median, above 0 and below 1."""
    text = value.strip()
    try:
        fraction = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise ValueError(
            f"{where}: {value!r} is not a precision; write a fraction such as "
            "0.02 or a percentage such as 2%"
        ) from None
    if not 0 < fraction < 1:
        raise ValueError(f"{where}: {value!r} must lie between 0 and 1 (0% and 100%)")
    return fraction


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


def parse_histogram_prefix(value: str, where: str) -> str:
    """Refuse a test path that argparse took as the optional PREFIX."""
    if value.endswith(".py") or "::" in value or Path(value).is_dir():
        raise ValueError(
            f"{where}: {value!r} is a test path or a folder, not a file prefix; "
            f"write {where}=PREFIX (e.g. plots/bench), or put {where} after the paths"
        )
    return value


parse_columns = choices(COLUMNS, "column")
parse_group_by = choices(
    GROUP_BY + ("param:NAME",), "grouping", lambda name: name.startswith("param:")
)
parse_sort = choice(SORTS, "column to sort by")
parse_name_format = choice(NAME_FORMATS, "name format")
parse_time_unit = choice(TIME_UNITS, "time unit")


def parse_lock(value: str, where: str) -> str:
    """``auto``, ``off``, or a lock file's path."""
    text = value.strip()
    if not text:
        raise ValueError(f"{where}: name 'auto', 'off' or a lock file")
    return text.lower() if text.lower() in ("auto", "off") else text


def mark_kwargs(
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    where: str,
    allowed: tuple[str, ...],
) -> Mapping[str, Any]:
    """A marker's keyword arguments, checked against ``allowed``.

    ValueError naming ``where`` for positional arguments or an unknown keyword.
    """
    if args:
        raise ValueError(f"{where}: takes keyword arguments only, got {args!r}")
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise ValueError(
            f"{where}: unexpected argument(s) {unknown}; allowed: {', '.join(allowed)}"
        )
    return kwargs
