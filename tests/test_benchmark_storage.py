"""JSON in pytest-benchmark's schema, saved runs, baselines and regressions."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_mps.benchmark import storage
from pytest_mps.benchmark.records import parse_fail_expr

FAST = (
    "-p",
    "no:cacheprovider",
    "-p",
    "no:hypothesispytest",
    "--mps-benchmark-max-time=0.01",
)

TESTS = """
import pytest

def test_sum(mps_benchmark):
    mps_benchmark(sum, range(100))

@pytest.mark.parametrize("n", [10, 20])
def test_param(mps_benchmark, n):
    mps_benchmark.measure("sorted", sorted, list(range(n, 0, -1)))
"""


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest(*FAST, *args)


def saved(pytester: pytest.Pytester) -> list[Path]:
    return sorted((pytester.path / ".benchmarks").glob("*/*.json"))


def test_json_is_read_back_by_pytest_benchmarks_own_loader(
    pytester: pytest.Pytester,
) -> None:
    file_storage = pytest.importorskip("pytest_benchmark.storage.file")
    logger = pytest.importorskip("pytest_benchmark.logger")
    pytester.makepyfile(TESTS)
    run(pytester, "--mps-benchmark-json=out.json").assert_outcomes(passed=3)
    doc = json.loads((pytester.path / "out.json").read_text())
    assert set(doc) == {
        "machine_info",
        "commit_info",
        "benchmarks",
        "datetime",
        "version",
    }
    store = file_storage.FileStorage(pytester.path, logger.Logger(0))
    loaded = {
        b["name"]: b for b in store.load_benchmarks(str(pytester.path / "out.json"))
    }
    assert set(loaded) == {
        "test_sum",
        "test_param[10]::sorted",
        "test_param[20]::sorted",
    }
    bench = loaded["test_param[10]::sorted"]
    assert bench["params"] == {"n": 10} and bench["param"] == "10"
    for field in ("min", "max", "mean", "stddev", "median", "iqr", "ops", "rounds"):
        assert isinstance(bench[field], (int, float)), field
    assert len(bench["data"]) == bench["rounds"]
    extra = bench["extra_info"]
    assert extra["device"] == "cpu" and extra["label"] == "sorted"
    assert extra["base_name"] == "test_param[10]::sorted"
    assert {"dispatch_ratio", "verdict", "device_time_median", "peak_memory"} <= set(
        extra
    )
    info = doc["machine_info"]
    assert info["machine_key"].startswith(f"{info['system']}-CPython-")
    assert info["cpu"]["brand_raw"] and "torch" in info


def test_pytest_benchmark_compare_prints_our_saved_runs(
    pytester: pytest.Pytester,
) -> None:
    cli = shutil.which("pytest-benchmark", path=os.path.dirname(sys.executable))
    if cli is None:
        pytest.skip("pytest-benchmark's command is not installed")
    pytester.makepyfile(TESTS)
    run(pytester, "--mps-benchmark-save=first").assert_outcomes(passed=3)
    (path,) = saved(pytester)
    out = subprocess.run(
        [cli, "compare", str(path)], capture_output=True, text=True, cwd=pytester.path
    )
    assert out.returncode == 0, out.stderr
    assert "test_param[10]::sorted" in out.stdout and "test_sum" in out.stdout


def test_save_numbers_runs_in_a_folder_per_machine(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(TESTS)
    result = run(pytester, "--mps-benchmark-save=base line")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["pytest-mps benchmark: saved *0001_base_line.json"])
    run(pytester, "--mps-benchmark-autosave").assert_outcomes(passed=3)
    first, second = saved(pytester)
    assert first.parent == second.parent
    key = json.loads(first.read_text())["machine_info"]["machine_key"]
    assert first.parent.name == key
    assert first.name == "0001_base_line.json"
    assert second.name.startswith("0002_")
    assert not list(first.parent.glob(".*.tmp"))


def test_storage_option_and_ini_autosave(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmps_benchmark_autosave = true\n")
    pytester.makepyfile(TESTS)
    run(pytester, "--mps-benchmark-storage=runs").assert_outcomes(passed=3)
    assert len(list((pytester.path / "runs").glob("*/0001_*.json"))) == 1


def test_compare_shows_the_change_against_the_latest_run(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(TESTS)
    run(pytester, "--mps-benchmark-save=base").assert_outcomes(passed=3)
    result = run(pytester, "--mps-benchmark-compare")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        [
            "*vs baseline*",
            "test_sum *%",
            "pytest-mps benchmark: compared with *0001_base.json",
        ]
    )
    assert result.ret == 0


def _slow_down_baseline(path: Path, factor: float) -> None:
    doc = json.loads(path.read_text())
    for bench in doc["benchmarks"]:
        for key in ("min", "max", "mean", "median"):
            bench["stats"][key] *= factor
        bench["stats"]["data"] = [v * factor for v in bench["stats"].get("data", [])]
        ci = bench["extra_info"]["median_ci99"] or []
        bench["extra_info"]["median_ci99"] = [v * factor for v in ci] or None
    path.write_text(json.dumps(doc))


def test_compare_fail_fails_the_session_on_a_regression(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(TESTS)
    run(pytester, "--mps-benchmark-save=base").assert_outcomes(passed=3)
    (path,) = saved(pytester)
    # the baseline was 100x faster: far enough that even a baseline measured on a
    # busy machine (its median's 99% interval 5x wide) lies apart from now
    _slow_down_baseline(path, 0.01)
    result = run(
        pytester,
        "--mps-benchmark-compare=base",
        "--mps-benchmark-compare-fail=median:50%",
    )
    result.assert_outcomes(passed=3)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*pytest-mps benchmark regressions*",
            "Name * Stat * Baseline (*s) * Now (*s) * Change * Threshold (*s) *",
            "test_sum * median * +*% * (median:50%) * 99% CIs apart",
            "*3 passed, 3 benchmarks regressed in *",
        ]
    )
    # A generous absolute threshold lets the same run pass.
    result = run(
        pytester,
        "--mps-benchmark-compare=0001",
        "--mps-benchmark-compare-fail=median:10",
    )
    assert result.ret == 0


def test_a_baseline_without_the_gates_statistic_fails_naming_file_and_field(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(TESTS)
    run(pytester, "--mps-benchmark-save=base").assert_outcomes(passed=3)
    (path,) = saved(pytester)
    doc = json.loads(path.read_text())
    del doc["benchmarks"][0]["stats"]["median"]
    path.write_text(json.dumps(doc))
    result = run(
        pytester,
        "--mps-benchmark-compare=base",
        "--mps-benchmark-compare-fail=median:10%",
    )
    # never a silent pass: the gate could not judge that benchmark
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stdout.fnmatch_lines(
        [
            "ERROR: baseline *0001_base.json cannot be compared: its benchmark "
            "'test_*' has no number at stats.median, which the threshold "
            "median:10% needs; save a new baseline (--mps-benchmark-save NAME)"
        ]
    )


BURST = """
import time

calls = [0]


def work(slow_calls):
    # slow for the first `slow_calls` calls of the session: a burst of load
    calls[0] += 1
    if calls[0] <= slow_calls:
        time.sleep(0.01)


def test_work(mps_benchmark):
    mps_benchmark.pedantic(work, args=(SLOW_CALLS,), rounds=5)
"""


@pytest.mark.parametrize(
    ("slow_calls", "attempts", "regressed"),
    # 5: slow through the first measurement's 5 rounds only (a median of 10 ms
    # against the baseline's half microsecond), fast when measured again;
    # 15: slow through all 3 attempts, as a slower commit is. The threshold,
    # 1000x, is far above the noise of 5 rounds of a sub-microsecond function
    # (+24% to +50% seen on a busy machine) and far below the sleep.
    [(5, 2, False), (15, 3, True)],
    ids=["a-burst-of-load-passes", "a-lasting-slowdown-fails"],
)
def test_a_regressing_benchmark_is_measured_again_before_it_counts(
    pytester: pytest.Pytester, slow_calls: int, attempts: int, regressed: bool
) -> None:
    pytester.makepyfile(test_burst=BURST.replace("SLOW_CALLS", "0"))
    run(pytester, "--mps-benchmark-save=base").assert_outcomes(passed=1)
    pytester.makepyfile(test_burst=BURST.replace("SLOW_CALLS", str(slow_calls)))
    result = run(
        pytester,
        "--mps-benchmark-compare=base",
        "--mps-benchmark-compare-fail=median:100000%",
        "--mps-benchmark-json=out.json",
    )
    result.assert_outcomes(passed=1)
    if regressed:
        assert result.ret == pytest.ExitCode.TESTS_FAILED
        result.stdout.fnmatch_lines(["*1 passed, 1 benchmark regressed in *"])
    else:
        assert result.ret == 0, result.stdout.str()
    (bench,) = json.loads((pytester.path / "out.json").read_text())["benchmarks"]
    assert bench["extra_info"]["gate_attempts"] == attempts


def test_a_marker_threshold_replaces_the_sessions(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.mps_benchmark(compare_fail="median:100000%")
        def test_lenient(mps_benchmark):
            mps_benchmark(sum, range(100))

        def test_strict(mps_benchmark):
            mps_benchmark(sum, range(100))
        """
    )
    run(pytester, "--mps-benchmark-save=base").assert_outcomes(passed=2)
    (path,) = saved(pytester)
    _slow_down_baseline(path, 0.1)
    pytester.makeini("[pytest]\nmps_benchmark_compare_fail = median:5%\n")
    result = run(pytester, "--mps-benchmark-compare")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        ["test_strict * median *", "*2 passed, 1 benchmark regressed in *"]
    )
    result.stdout.no_fnmatch_line("test_lenient * median *")


def test_missing_baseline_is_a_clear_message_not_a_traceback(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(TESTS)
    result = run(pytester, "--mps-benchmark-compare")
    result.assert_outcomes(passed=3)
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [
            "pytest-mps benchmark: cannot compare: no baseline for this machine: "
            "*holds no saved run; save one with --mps-benchmark-save NAME or "
            "--mps-benchmark-autosave"
        ]
    )
    result.stdout.no_fnmatch_line("*Traceback*")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--mps-benchmark-compare-fail=min:5%",),
            "--mps-benchmark-compare-fail needs a baseline: add "
            "--mps-benchmark-compare [[]RUN[]]",
        ),
        (
            ("--mps-benchmark-compare", "--mps-benchmark-compare-fail=min:5%"),
            "--mps-benchmark-compare-fail needs a baseline: .benchmarks holds no "
            "saved run; save one first with --mps-benchmark-save NAME or "
            "--mps-benchmark-autosave",
        ),
    ],
)
def test_the_gate_without_a_baseline_is_a_usage_error_in_one_line(
    pytester: pytest.Pytester, args: tuple[str, ...], message: str
) -> None:
    pytester.makepyfile(TESTS)
    result = run(pytester, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])
    assert len([line for line in result.stderr.lines if line.strip()]) == 1


def test_the_gate_with_no_matching_run_is_a_usage_error(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(TESTS)
    run(pytester, "--mps-benchmark-save=base").assert_outcomes(passed=3)
    result = run(
        pytester,
        "--mps-benchmark-compare=nightly",
        "--mps-benchmark-compare-fail=median:5%",
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: --mps-benchmark-compare-fail needs a baseline: no saved run "
            "matches 'nightly' in .benchmarks*"
        ]
    )
    assert len([line for line in result.stderr.lines if line.strip()]) == 1


def test_the_gate_without_this_machines_runs_fails_after_the_tests_with_exit_4(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(TESTS)
    run(pytester, "--mps-benchmark-save=base").assert_outcomes(passed=3)
    (path,) = saved(pytester)
    path.parent.rename(path.parent.with_name("Darwin-CPython-3.12-64bit-M3"))
    result = run(
        pytester, "--mps-benchmark-compare", "--mps-benchmark-compare-fail=median:5%"
    )
    result.assert_outcomes(passed=3)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.stdout.lines if line.startswith("ERROR:")]
    assert len(errors) == 1
    assert errors[0].startswith(
        "ERROR: --mps-benchmark-compare-fail needs a baseline: no baseline for "
        "this machine:"
    )
    # the message is that one line: what follows it is pytest's closing line
    after = result.stdout.lines[result.stdout.lines.index(errors[0]) + 1 :]
    assert [line for line in after if line.strip()][:1] == [
        line for line in result.stdout.lines if line.startswith("=")
    ][-1:]


def test_ini_thresholds_alone_apply_only_when_comparing(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeini("[pytest]\nmps_benchmark_compare_fail = median:5%\n")
    pytester.makepyfile(TESTS)
    result = run(pytester)
    result.assert_outcomes(passed=3)
    assert result.ret == 0


def test_another_machines_runs_are_named_but_not_used(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(TESTS)
    run(pytester, "--mps-benchmark-save=base").assert_outcomes(passed=3)
    (path,) = saved(pytester)
    mac = "Darwin-CPython-3.12-64bit-Apple_M3_Max-40gpu"
    doc = json.loads(path.read_text())
    doc["machine_info"]["machine_key"] = mac
    path.write_text(json.dumps(doc))
    other = path.parent.with_name(mac)
    path.parent.rename(other)
    result = run(pytester, "--mps-benchmark-compare")
    result.stdout.fnmatch_lines(
        [
            "*cannot compare: no baseline for this machine*Saved runs of other "
            f"machines: {mac} (1 runs); their timings are not comparable*"
        ]
    )
    # Named by its path, it is compared, with a warning.
    result = run(pytester, f"--mps-benchmark-compare={other / path.name}")
    result.stdout.fnmatch_lines(
        [
            "pytest-mps benchmark: warning: baseline * was recorded on another machine "
            f"({mac}; this one is *): the comparison mixes hardware",
            "pytest-mps benchmark: compared with *",
        ]
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            '{"benchmarks": [',
            "is corrupt (not JSON: Expecting value, line 1 column 17); delete it "
            "or save a new run",
        ),
        (
            '{"benchmarks": [{"fullname": "x", "stats": {"median": "unterminated',
            "is corrupt (not JSON: Unterminated string starting, line 1 column "
            "55); delete it or save a new run",
        ),
        ('{"machine": 1}', "is not a benchmark file (no 'benchmarks' list"),
        ('{"benchmarks": [{"name": "x"}]}', "is not a benchmark file"),
        (
            "\udcff",
            "is not UTF-8 text (byte 0: b'\\xff'): it is not a benchmark file "
            "pytest-mps saved; pass another file, or delete it and save a new run "
            "with --mps-benchmark-save NAME",
        ),
    ],
)
def test_a_corrupt_baseline_is_a_clear_message(
    pytester: pytest.Pytester, content: str, message: str
) -> None:
    pytester.makepyfile(TESTS)
    run(pytester, "--mps-benchmark-save=base").assert_outcomes(passed=3)
    (path,) = saved(pytester)
    path.write_bytes(content.encode("utf-8", "surrogateescape"))
    result = run(pytester, "--mps-benchmark-compare")
    result.assert_outcomes(passed=3)
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [f"pytest-mps benchmark: cannot compare: baseline *{message}*"]
    )


def test_compare_with_an_unknown_run_lists_the_saved_ones(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(TESTS)
    run(pytester, "--mps-benchmark-save=base").assert_outcomes(passed=3)
    result = run(pytester, "--mps-benchmark-compare=nightly")
    result.stdout.fnmatch_lines(
        ["*cannot compare: no saved run matches 'nightly' in * (saved: 0001_base.json)"]
    )
    result = run(pytester, "--mps-benchmark-compare=gone.json")
    result.stdout.fnmatch_lines(
        ["*cannot compare: baseline file gone.json does not exist"]
    )


def test_an_interrupted_write_leaves_the_old_file_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "run.json"
    storage.write_atomic(target, {"benchmarks": [1]})

    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        storage.write_atomic(target, {"benchmarks": [2] * 1000})
    assert json.loads(target.read_text()) == {"benchmarks": [1]}
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


def _info(**overrides: Any) -> dict[str, Any]:
    info: dict[str, Any] = {
        "system": "Darwin",
        "python_implementation": "CPython",
        "python_version": "3.12.4",
        "cpu": {"brand_raw": "Apple M3 Max"},
        "gpu_cores": 40,
        "gpus": [],
    }
    info.update(overrides)
    return info


def test_machine_keys_tell_chips_core_counts_and_gpus_apart() -> None:
    keys = {
        storage.machine_key(_info()),
        storage.machine_key(_info(gpu_cores=30)),
        storage.machine_key(_info(cpu={"brand_raw": "Apple M2 Max"})),
        storage.machine_key(
            _info(
                system="Linux",
                cpu={"brand_raw": "AMD EPYC 9454"},
                gpu_cores=None,
                gpus=[{"name": "NVIDIA H100 80GB HBM3"}],
            )
        ),
        storage.machine_key(
            _info(system="Linux", cpu={"brand_raw": "AMD EPYC 9454"}, gpu_cores=None)
        ),
    }
    assert len(keys) == 5
    assert storage.machine_key(_info()).endswith("-Apple_M3_Max-40gpu")


def test_machine_info_lists_the_gpus_the_benchmarks_ran_on() -> None:
    benches = [
        {
            "extra_info": {
                "device": "cuda:0",
                "hardware": "NVIDIA H100",
                "capability": "9.0",
            }
        },
        {"extra_info": {"device": "cpu", "hardware": "AMD EPYC"}},
    ]
    info = storage.machine_info(benches)
    assert info["gpus"] == [{"name": "NVIDIA H100", "capability": "9.0"}]
    assert info["machine_key"].endswith("-NVIDIA_H100")


@pytest.mark.parametrize(
    ("text", "stat", "amount", "percent", "limit"),
    [
        ("median:10%", "median", 10.0, True, 1.1),
        ("min:0.001", "min", 0.001, False, 1.001),
    ],
)
def test_compare_fail_expressions(
    text: str, stat: str, amount: float, percent: bool, limit: float
) -> None:
    expr = parse_fail_expr(text, "x")
    assert (expr.stat, expr.amount, expr.percent) == (stat, amount, percent)
    assert str(expr) == text
    assert expr.limit(1.0) == pytest.approx(limit)


def test_json_path_is_relative_to_the_invocation_directory(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(TESTS)
    sub = pytester.mkdir("sub")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(sub)
        result = pytester.runpytest(
            *FAST, str(pytester.path), "--mps-benchmark-json=o.json"
        )
    result.assert_outcomes(passed=3)
    assert (sub / "o.json").is_file()


def test_compare_never_takes_a_following_test_path_as_the_run(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_speed="def test_nothing():\n    pass\n")
    result = pytester.runpytest("--mps-benchmark-compare", "test_speed.py")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*--mps-benchmark-compare: 'test_speed.py' is a test path, not a saved "
            "run; write --mps-benchmark-compare=RUN, or put --mps-benchmark-compare "
            "after the paths*"
        ]
    )


def _save_after(barrier: Any, folder: str, index: int) -> None:
    doc = {"machine_info": {"machine_key": "m"}, "benchmarks": [], "index": index}
    barrier.wait()  # every process saves at the same moment
    storage.save_run(Path(folder), doc, "base")


def test_concurrent_saves_keep_every_run(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(6)
    workers = [
        context.Process(target=_save_after, args=(barrier, str(tmp_path), i))
        for i in range(6)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    names = sorted(p.name for p in (tmp_path / "m").glob("*.json"))
    assert names == [f"{i:04d}_base.json" for i in range(1, 7)]
    kept = sorted(
        json.loads((tmp_path / "m" / name).read_text())["index"] for name in names
    )
    assert kept == list(range(6))


def test_two_sessions_saving_at_once_keep_both_runs(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(TESTS)
    command = [sys.executable, "-m", "pytest", *FAST, "--mps-benchmark-save=base"]
    sessions = [
        subprocess.Popen(
            command, cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        for _ in range(2)
    ]
    for session in sessions:
        out, _ = session.communicate(timeout=300)
        assert session.returncode == 0, out.decode()
    assert [p.name for p in saved(pytester)] == ["0001_base.json", "0002_base.json"]


def test_a_run_is_saved_without_its_rounds_unless_asked(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(TESTS)
    run(pytester, "--mps-benchmark-save=lean").assert_outcomes(passed=3)
    run(
        pytester, "--mps-benchmark-save=full", "--mps-benchmark-save-data"
    ).assert_outcomes(passed=3)
    lean, full = (json.loads(p.read_text())["benchmarks"] for p in saved(pytester))
    assert all("data" not in b["stats"] for b in lean)
    assert all(len(b["stats"]["data"]) == b["stats"]["rounds"] for b in full)
    assert all(len(b["extra_info"]["median_ci99"]) == 2 for b in lean)


def test_a_baseline_with_rounds_is_compared_by_mann_whitney(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(TESTS)
    run(
        pytester, "--mps-benchmark-save=base", "--mps-benchmark-save-data"
    ).assert_outcomes(passed=3)
    (path,) = saved(pytester)
    _slow_down_baseline(path, 0.1)
    result = run(
        pytester, "--mps-benchmark-compare", "--mps-benchmark-compare-fail=median:50%"
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["test_sum * median * Mann-Whitney p=*"])


def test_a_regression_is_counted_beside_plugins_that_read_every_report(
    pytester: pytest.Pytester,
) -> None:
    # The Hypothesis plugin reads the __dict__ of every entry in the stats.
    pytest.importorskip("hypothesis")
    pytester.makepyfile(TESTS)
    run(pytester, "--mps-benchmark-save=base").assert_outcomes(passed=3)
    (path,) = saved(pytester)
    _slow_down_baseline(path, 0.1)
    result = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "--mps-benchmark-max-time=0.01",
        "--mps-benchmark-compare",
        "--mps-benchmark-compare-fail=median:50%",
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*3 passed, * regressed in *"])
    result.stdout.no_fnmatch_line("*Traceback*")


def test_past_ten_thousand_rounds_the_json_keeps_a_uniform_sample() -> None:
    from pytest_mps.benchmark.fixture import MAX_DATA
    from pytest_mps.benchmark.stats import Stats

    rounds = [float(i) for i in range(25_000)]
    out = Stats.from_data(rounds, 1).as_dict(MAX_DATA)
    kept = out["data"]
    assert out["data_sample"] == {"kept": MAX_DATA, "of": 25_000}
    assert len(kept) == MAX_DATA == len(set(kept))
    assert kept == sorted(kept)  # in round order
    # uniform: each fifth of the rounds holds about a fifth of the sample
    fifths = [sum(1 for v in kept if k * 5000 <= v < (k + 1) * 5000) for k in range(5)]
    assert all(1800 < n < 2200 for n in fifths), fifths
    assert Stats.from_data(rounds, 1).as_dict(MAX_DATA)["data"] == kept
    assert out["rounds"] == 25_000
    assert out["median"] == Stats.from_data(rounds, 1).median
    small = Stats.from_data(rounds[:100], 1).as_dict(MAX_DATA)
    assert "data_sample" not in small and len(small["data"]) == 100


def test_a_long_benchmark_saves_its_sampled_rounds(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.mps_benchmark(max_time=0.5, warmup=False)
        def test_nothing(mps_benchmark):
            mps_benchmark(lambda: None)
        """
    )
    pytester.runpytest(
        "-p", "no:cacheprovider", "--mps-benchmark-save=s", "--mps-benchmark-save-data"
    ).assert_outcomes(passed=1)
    (entry,) = json.loads(saved(pytester)[0].read_text())["benchmarks"]
    stats = entry["stats"]
    if stats["rounds"] <= 10_000:
        pytest.skip(f"only {stats['rounds']} rounds in 0.5 s on this machine")
    assert len(stats["data"]) == 10_000
    assert stats["data_sample"] == {"kept": 10_000, "of": stats["rounds"]}
