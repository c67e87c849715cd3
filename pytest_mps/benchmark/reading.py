"""Reading the benchmark flags and their ini twins, once per session.

:mod:`.flags` adds them at start-up; this reads and validates them when a run
asks for benchmarks (:mod:`.hooks`). Precedence: marker > command line > ini.
A bad value is a usage error naming the flag, or the ini option and its file.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_mps.benchmark import options as o
from pytest_mps.benchmark.flags import parse_processes
from pytest_mps.options import read_setting

if TYPE_CHECKING:
    from pytest_mps.benchmark.records import BenchmarkOptions, Table


def _setting(config: pytest.Config, name: str, parse: Callable[[str, str], Any]) -> Any:
    """An option's value, command line over ini, validated naming its source."""
    return read_setting(config, name, parse)


def _switch(config: pytest.Config, name: str) -> bool:
    value = config.getoption(name)
    return bool(config.getini(name) if value is None else value)


def _table(config: pytest.Config) -> Table:
    from pytest_mps.benchmark.records import Table

    columns = _setting(config, "mps_benchmark_columns", o.parse_columns)
    default = Table()
    return Table(
        columns=columns or default.columns,
        chosen=columns is not None,
        sort=_setting(config, "mps_benchmark_sort", o.parse_sort) or default.sort,
        group_by=_setting(config, "mps_benchmark_group_by", o.parse_group_by)
        or default.group_by,
        name=_setting(config, "mps_benchmark_name", o.parse_name_format)
        or default.name,
        time_unit=_setting(config, "mps_benchmark_time_unit", o.parse_time_unit)
        or default.time_unit,
    )


def _histogram(config: pytest.Config) -> Path | None:
    prefix = config.getoption("mps_benchmark_histogram")
    where = "--mps-benchmark-histogram"
    if prefix is None:
        prefix = config.getini("mps_benchmark_histogram") or None
        where = f"ini option mps_benchmark_histogram in {config.inipath}"
    if prefix is None:
        return None
    try:
        # Imported now (only under this flag), so a missing or broken
        # matplotlib stops the run before the benchmarks rather than after.
        importlib.import_module("matplotlib")
    except ImportError:
        raise pytest.UsageError(
            f"{where} needs matplotlib, which is not installed: "
            "pip install 'pytest-mps[plot]'"
        ) from None
    return Path(prefix)


def read_options(config: pytest.Config) -> BenchmarkOptions:
    """Validate the options and ini values; UsageError naming the culprit."""
    from pytest_mps.benchmark.records import BenchmarkOptions, Settings, parse_fail_expr

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
    storage = config.getoption("mps_benchmark_storage") or config.getini(
        "mps_benchmark_storage"
    )
    defaults = Settings()

    def setting(name: str, parse: Callable[[str, str], Any], default: Any) -> Any:
        value = _setting(config, name, parse)
        return default if value is None else value

    json_path = config.getoption("mps_benchmark_json")
    return BenchmarkOptions(
        only=bool(only),
        skip=bool(skip),
        json=Path(json_path) if json_path else None,
        save=config.getoption("mps_benchmark_save"),
        autosave=_switch(config, "mps_benchmark_autosave"),
        save_data=_switch(config, "mps_benchmark_save_data"),
        compare=config.getoption("mps_benchmark_compare"),
        compare_fail=fail,
        devices=_setting(config, "mps_benchmark_devices", o.parse_device_list) or (),
        storage=Path(config.rootpath, storage or ".benchmarks"),
        settings=defaults._replace(
            min_time=setting("mps_benchmark_min_time", o.parse_seconds, 5e-6),
            max_time=setting("mps_benchmark_max_time", o.parse_seconds, 1.0),
            min_rounds=setting("mps_benchmark_min_rounds", o.parse_rounds, 5),
            warmup=setting("mps_benchmark_warmup", o.parse_warmup, True),
            precision=_setting(config, "mps_benchmark_precision", o.parse_precision),
            disable_gc=_switch(config, "mps_benchmark_disable_gc"),
        ),
        lock=setting("mps_benchmark_lock", o.parse_lock, "auto"),
        alias=_switch(config, "mps_benchmark_alias"),
        disable=_switch(config, "mps_benchmark_disable")
        and not config.getoption("mps_benchmark_enable"),
        table=_table(config),
        histogram=_histogram(config),
        cprofile=_setting(config, "mps_benchmark_cprofile", o.parse_cprofile_column),
        compare_rev=_setting(config, "mps_benchmark_compare_rev", o.parse_rev),
        compare_processes=_setting(
            config, "mps_benchmark_compare_processes", parse_processes
        )
        or o.COMPARE_PROCESSES,
        compare_machine=_setting(
            config, "mps_benchmark_compare_machine", o.parse_compare_machine
        )
        or "warn",
    )
