"""The terminal tables, from result entries as the JSON holds them."""

from __future__ import annotations

from typing import Any

from pytest_mps.benchmark.report import device_table, format_time, results_table


def entry(name: str, device: str, median: float, **extra: Any) -> dict[str, Any]:
    stats = {"min": median * 0.9, "median": median, "mean": median * 1.1}
    stats.update(max=median * 2, stddev=median * 0.1, ops=1 / median / 1.1)
    stats.update(iqr=median * 0.05, rounds=10, iterations=3, outliers="1;0")
    info = {"device": device, "base_name": name, "dispatch_ratio": 0.2}
    info.update(verdict=None if device == "cpu" else "device-bound", **extra)
    return {
        "name": f"{name}[{device}]",
        "fullname": f"t.py::{name}[{device}]",
        "group": None,
        "stats": stats,
        "extra_info": info,
    }


def test_format_time_picks_a_unit() -> None:
    assert format_time(0.5) == "500 ms"
    assert format_time(2.5e-5) == "25 us"
    assert format_time(3) == "3 s"
    assert format_time(4e-9) == "4 ns"


def test_device_table_shows_speedups_against_cpu() -> None:
    lines = device_table(
        [
            entry("test_mm", "cuda:0", 0.001),
            entry("test_mm", "cpu", 0.05),
            entry("test_add", "cpu", 0.002),
        ]
    )
    assert "speedup vs cpu" in lines[0]
    header = lines[1].split()
    assert header[-2:] == ["cpu", "cuda:0"]
    (row,) = [line for line in lines if line.startswith("test_mm")]
    assert row.split()[1:] == ["50", "ms", "1", "ms", "(50.00x)"]
    assert not any(line.startswith("test_add") for line in lines)


def test_device_table_is_empty_with_one_device() -> None:
    assert device_table([entry("test_mm", "cpu", 0.05)]) == []


def test_results_table_flags_disagreeing_events_and_unsettled_warmup() -> None:
    lines = results_table(
        [
            entry(
                "test_mm",
                "mps",
                0.001,
                device_time_median=0.0005,
                events_agree=False,
                warmup_stable=False,
                warmup_rounds=9,
                peak_memory=3 * 2**20,
            )
        ]
    )
    text = "\n".join(lines)
    assert "Events median" in text and "Peak memory" in text
    assert "500.0000 !" in text and "3.0 MiB" in text
    assert "device-bound" in text and "0.20" in text
    assert "they disagree, so the wall time is reported" in text
    assert "warmup did not settle within max_time (9 rounds)" in text
