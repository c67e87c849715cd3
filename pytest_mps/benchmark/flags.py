"""The benchmark flags and their ini twins, added at every start-up.

A bad value on the command line is an argparse error naming the flag;
:mod:`.reading` reads them all, ini twins included, when a run asks for
benchmarks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from pytest_mps import ownership
from pytest_mps.benchmark import options as o
from pytest_mps.options import argparse_check

if TYPE_CHECKING:
    from pytest_mps.benchmark.records import FailExpr

ONLY_HELP = "run only the tests that use the mps_benchmark fixture."
SKIP_HELP = "skip the tests that use the mps_benchmark fixture."
JSON_HELP = (
    "write the benchmarks to PATH in pytest-benchmark's JSON schema, every "
    "round's time included."
)
SAVE_HELP = "save the run as STORAGE/<machine key>/NNNN_NAME.json."
AUTOSAVE_HELP = "save every run as STORAGE/<machine key>/NNNN_<commit>_<time>.json."
SAVE_DATA_HELP = (
    "also save every round's time in saved runs (pytest-benchmark's "
    "--benchmark-save-data); a baseline with them is compared by a "
    "Mann-Whitney test."
)
COMPARE_HELP = (
    "compare with a saved run of this machine: its number (0003), part of its "
    "name, or a file path; alone, the latest."
)
COMPARE_FAIL_HELP = (
    "fail the session when a benchmark is slower than the compared run by more "
    "than STAT:N% or STAT:SECONDS (STAT: min, max, mean, median) and the "
    "difference is significant. Repeatable; needs --mps-benchmark-compare "
    "(the ini value only sets the thresholds used when comparing)."
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
MIN_ROUNDS_HELP = "fewest rounds, even past max-time (default 5)."
WARMUP_HELP = (
    "warmup: 'auto' (until stable, the default), a number of rounds, or 'off'."
)
PRECISION_HELP = (
    "stop a benchmark's rounds once the 95% confidence interval of the median "
    "lies within this fraction of it (0.02 or 2%), bounded by min-rounds and "
    "max-time."
)
DISABLE_GC_HELP = "turn garbage collection off while timing."
DISABLE_HELP = (
    "run each benchmarked function once, as a plain test: no timing, no table "
    "(like --benchmark-disable)."
)
ENABLE_HELP = "measure even where the ini file sets mps_benchmark_disable."
LOCK_HELP = (
    "measure one benchmark at a time on this machine: 'auto' (a lock file per "
    "user in the temp folder, the default), a lock file's PATH, or 'off'."
)
ALIAS_HELP = (
    "also provide pytest-benchmark's 'benchmark' fixture and marker, timed by "
    "pytest-mps, so tests written for pytest-benchmark run unchanged."
)
COLUMNS_HELP = f"columns of the results table, from: {', '.join(o.COLUMNS)}."
SORT_HELP = f"sort each table by one of: {', '.join(o.SORTS)} (default name)."
GROUP_BY_HELP = (
    f"split the tables by: {', '.join(o.GROUP_BY)} or param:NAME, comma-"
    "separated (default group)."
)
NAME_HELP = "names in the table: short, normal (the default) or long (node ids)."
TIME_UNIT_HELP = "time unit of the tables: auto (per group), s, ms, us or ns."
COMPARE_REV_HELP = (
    "measure the selected benchmarks at this git revision (a temporary "
    "worktree) and in this tree, in pairs of processes that run side by side "
    "and take turns block by block, and compare per benchmark: slower when a "
    "one-sided Wilcoxon signed-rank test over the pairs' ratios says p < 0.05 "
    "and the change passes --mps-benchmark-compare-fail's median:X% (default "
    "5%). Trustworthy where the host's speed drifts (cloud hosts)."
)
COMPARE_PROCESSES_HELP = (
    "pairs of processes for --mps-benchmark-compare-rev (default 7, at least 5)."
)
COMPARE_MACHINE_HELP = (
    "when the baseline's machine fingerprint differs from this run's in OS "
    "version or build, chip, GPU, Metal or MPSGraph, virtual or not, torch or "
    "its build: warn (the default: name the fields) or refuse (no comparison; "
    "the run exits with a usage error)."
)
CPROFILE_HELP = (
    "profile each benchmarked function once more after timing it (cProfile) and "
    "save its 25 top functions by this column into the JSON: "
    + ", ".join(o.CPROFILE_COLUMNS)
    + " (like --benchmark-cprofile; the marker's cprofile=True does it for one "
    "test, by cumtime)."
)
HISTOGRAM_HELP = (
    "draw a box plot of each group's rounds into PREFIX-<group>.png "
    "(needs matplotlib: pip install 'pytest-mps[plot]')."
)


def _fail_expr(value: str, where: str) -> FailExpr:
    from pytest_mps.benchmark.records import parse_fail_expr

    return parse_fail_expr(value, where)


def parse_processes(value: str, where: str) -> int:
    """The A/B gate's process pairs, checked as the gate checks them."""
    from pytest_mps.benchmark.ab import valid_processes

    return valid_processes(value, where)


# flag -> (parser, help); each has an ini twin of the same name.
_VALUED: dict[str, tuple[Callable[[str, str], Any], str]] = {
    "--mps-benchmark-min-time": (o.parse_seconds, MIN_TIME_HELP),
    "--mps-benchmark-max-time": (o.parse_seconds, MAX_TIME_HELP),
    "--mps-benchmark-min-rounds": (o.parse_rounds, MIN_ROUNDS_HELP),
    "--mps-benchmark-warmup": (o.parse_warmup, WARMUP_HELP),
    "--mps-benchmark-precision": (o.parse_precision, PRECISION_HELP),
    "--mps-benchmark-lock": (o.parse_lock, LOCK_HELP),
    "--mps-benchmark-columns": (o.parse_columns, COLUMNS_HELP),
    "--mps-benchmark-sort": (o.parse_sort, SORT_HELP),
    "--mps-benchmark-group-by": (o.parse_group_by, GROUP_BY_HELP),
    "--mps-benchmark-name": (o.parse_name_format, NAME_HELP),
    "--mps-benchmark-time-unit": (o.parse_time_unit, TIME_UNIT_HELP),
    "--mps-benchmark-devices": (o.parse_device_list, DEVICES_HELP),
    "--mps-benchmark-cprofile": (o.parse_cprofile_column, CPROFILE_HELP),
    "--mps-benchmark-compare-rev": (o.parse_rev, COMPARE_REV_HELP),
    "--mps-benchmark-compare-processes": (parse_processes, COMPARE_PROCESSES_HELP),
    "--mps-benchmark-compare-machine": (o.parse_compare_machine, COMPARE_MACHINE_HELP),
}
# flag -> help; store_true flags with a boolean ini twin.
_SWITCHES = {
    "--mps-benchmark-autosave": AUTOSAVE_HELP,
    "--mps-benchmark-save-data": SAVE_DATA_HELP,
    "--mps-benchmark-disable-gc": DISABLE_GC_HELP,
    "--mps-benchmark-disable": DISABLE_HELP,
    "--mps-benchmark-alias": ALIAS_HELP,
}


def _dest(flag: str) -> str:
    return flag[2:].replace("-", "_")


def add_options(parser: pytest.Parser) -> None:
    """Add the flags to the plugin's group and their ini twins."""
    group = parser.getgroup(
        ownership.BENCHMARK_GROUP,
        "pytest-mps benchmarks: sync-aware timing, saved runs and A/B gates",
        after=ownership.GROUP,
    )

    def add(flag: str, **attrs: Any) -> None:
        # an explicit dest spares pytest a search of every option's dest
        # (about 190 of them) for each flag: 1.5 ms at every start-up
        group.addoption(flag, dest=_dest(flag), **attrs)

    add("--mps-benchmark-only", action="store_true", default=False, help=ONLY_HELP)
    add("--mps-benchmark-skip", action="store_true", default=False, help=SKIP_HELP)
    add("--mps-benchmark-json", metavar="PATH", default=None, help=JSON_HELP)
    add("--mps-benchmark-save", metavar="NAME", default=None, help=SAVE_HELP)
    add(
        "--mps-benchmark-compare",
        metavar="RUN",
        nargs="?",
        const="",
        default=None,
        type=argparse_check(o.parse_compare_run, "--mps-benchmark-compare"),
        help=COMPARE_HELP,
    )
    add(
        "--mps-benchmark-compare-fail",
        metavar="EXPR",
        action="append",
        default=None,
        type=argparse_check(_fail_expr, "--mps-benchmark-compare-fail"),
        help=COMPARE_FAIL_HELP.replace("%", "%%"),  # argparse formats help with %
    )
    add("--mps-benchmark-storage", metavar="PATH", default=None, help=STORAGE_HELP)
    add(
        "--mps-benchmark-histogram",
        metavar="PREFIX",
        nargs="?",
        const="benchmark",
        default=None,
        type=argparse_check(o.parse_histogram_prefix, "--mps-benchmark-histogram"),
        help=HISTOGRAM_HELP,
    )
    add("--mps-benchmark-enable", action="store_true", default=False, help=ENABLE_HELP)
    for flag, text in _SWITCHES.items():
        add(flag, action="store_true", default=None, help=text)
        parser.addini(_dest(flag), text, type="bool", default=False)
    for flag, (parse, text) in _VALUED.items():
        add(
            flag,
            metavar="VALUE",
            default=None,
            type=argparse_check(parse, flag),
            help=text.replace("%", "%%"),
        )
        parser.addini(_dest(flag), text, default=None)
    parser.addini(
        "mps_benchmark_compare_fail", COMPARE_FAIL_HELP, type="linelist", default=[]
    )
    parser.addini("mps_benchmark_storage", STORAGE_HELP, default=None)
    parser.addini("mps_benchmark_histogram", HISTOGRAM_HELP, default=None)
