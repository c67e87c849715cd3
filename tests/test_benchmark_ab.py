"""--mps-benchmark-compare-rev: the baseline's code measured beside ours."""

from __future__ import annotations

import json
import subprocess

import pytest

from pytest_mps.benchmark import ab

pytest_plugins = ["pytester"]

WORK = """
def work():
    return sum(i * i for i in range({n}))
"""

TESTS = """
import pytest
from pkg import work


@pytest.mark.mps_benchmark
def test_work(mps_benchmark):
    mps_benchmark(work)


def test_plain():
    assert work() > 0
"""

FAST = ("-p", "no:cacheprovider", "--mps-benchmark-max-time=0.05")


def _git(pytester: pytest.Pytester, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.email=a@b", "-c", "user.name=a", *args],
        cwd=pytester.path,
        check=True,
        capture_output=True,
    )


@pytest.fixture
def repo(pytester: pytest.Pytester) -> pytest.Pytester:
    if subprocess.run(["git", "--version"], capture_output=True).returncode:
        pytest.skip("git is not installed")
    pytester.makepyfile(**{"pkg/__init__": WORK.format(n=2000), "test_b": TESTS})
    _git(pytester, "init", "-q")
    _git(pytester, "add", "-A")
    _git(pytester, "commit", "-qm", "base")
    return pytester


def test_a_slower_tree_is_caught_and_both_sides_are_kept(repo: pytest.Pytester) -> None:
    # six times the work in the working tree, uncommitted
    (repo.path / "pkg" / "__init__.py").write_text(WORK.format(n=12000))
    result = repo.runpytest_subprocess(
        *FAST,
        "--mps-benchmark-compare-rev=HEAD",
        "--mps-benchmark-compare-processes=4",
        "--mps-benchmark-json=ab.json",
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "pytest-mps A/B: process 1 of 8 (HEAD)",
            "pytest-mps A/B: process 2 of 8 (here)",
            "pytest-mps A/B: process 3 of 8 (here)",
            "*pytest-mps A/B comparison*",
            "pytest-mps A/B: HEAD (*) against this tree, 4 processes a side in "
            "ABBA order*",
            "this tree has uncommitted changes (* files, first pkg/__init__.py)*",
            "Benchmark*HEAD*here*change*95% CI*p*verdict",
            "test_b.py::test_work * slower",
        ]
    )
    found = json.loads((repo.path / "ab.json").read_text())
    record = found["benchmarks"]["test_b.py::test_work"]
    assert len(record["base_medians"]) == len(record["here_medians"]) == 4
    assert record["verdict"] == "slower" and record["ratio"] > 2
    low, high = record["ratio_ci95"]
    assert 1 < low <= record["ratio"] <= high
    assert found["dirty"][0] == "pkg/__init__.py"
    # the plain test is not a benchmark: it ran on neither side
    assert list(found["benchmarks"]) == ["test_b.py::test_work"]


def test_a_benchmark_on_one_side_only_is_said_and_fails(repo: pytest.Pytester) -> None:
    (repo.path / "test_new.py").write_text(
        "import pytest\n\n\n@pytest.mark.mps_benchmark\n"
        "def test_new(mps_benchmark):\n    mps_benchmark(lambda: None)\n"
    )
    result = repo.runpytest_subprocess(
        *FAST, "--mps-benchmark-compare-rev=HEAD", "--mps-benchmark-compare-processes=4"
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["only here, not at HEAD: test_new.py::test_new"])


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (
            ("--mps-benchmark-compare-rev=nope",),
            "ERROR: --mps-benchmark-compare-rev: 'nope' is not a commit of *",
        ),
        (
            ("--mps-benchmark-compare-rev=HEAD", "--mps-benchmark-compare-processes=3"),
            "ERROR: --mps-benchmark-compare-processes: at least 4 processes a side*",
        ),
        (
            ("--mps-benchmark-compare-rev=HEAD", "-n", "2"),
            "ERROR: --mps-benchmark-compare-rev runs its processes one at a time*",
        ),
    ],
)
def test_what_cannot_be_compared_is_a_usage_error(
    repo: pytest.Pytester, args: tuple[str, ...], error: str
) -> None:
    result = repo.runpytest_subprocess(*FAST, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([error])


def test_the_inner_runs_drop_the_options_the_comparison_sets() -> None:
    args = [
        "tests/",
        "--mps-benchmark-compare-rev",
        "main",
        "--mps-benchmark-compare-processes=6",
        "-n",
        "2",
        "--mps-benchmark-json=x.json",
        "--mps-benchmark-autosave",
        "-k",
        "mm",
    ]
    assert ab.inner_args(args) == ["tests/", "-k", "mm"]


def test_abba_order_gives_each_side_as_many_processes() -> None:
    assert ab.order(4) == list("ABBAABBA")
    assert ab.order(5) == list("ABBAABBAAB")


def test_same_samples_are_same_and_a_clear_shift_is_slower() -> None:
    base = [1.00, 1.02, 0.99, 1.01, 1.00]
    ratio, low, high, p, slower, faster = ab.compare(base, base, 0.05)
    assert ratio == 1 and not slower and not faster and p > 0.05
    shifted = [v * 1.2 for v in base]
    ratio, low, high, p, slower, faster = ab.compare(base, shifted, 0.05)
    assert slower and not faster and p < 0.05
    assert low <= ratio <= high and low > 1
    # significant but under the floor: not a regression
    small = [v * 1.03 + 0.001 for v in base]
    assert not ab.compare(base, small, 0.05)[4]
