"""--mps-benchmark-compare-rev: the baseline's code measured beside ours."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pytest_mps.benchmark import ab, baton, pairs

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
        "--mps-benchmark-compare-processes=5",
        "--mps-benchmark-json=ab.json",
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "pytest-mps A/B: pair 1 of 5",
            # an estimate from the pairs done
            "pytest-mps A/B: pair 2 of 5 (1 done in *s; about *s left)",
            "pytest-mps A/B: pair 5 of 5 (4 done in *s; about *s left)",
            "*pytest-mps A/B comparison*",
            "pytest-mps A/B: HEAD (*) against this tree, 5 pairs of processes "
            "taking turns block by block*",
            "this tree has uncommitted changes (*pkg/__init__.py)*",
            "Benchmark*HEAD*here*change*interval*p*verdict",
            "test_b.py::test_work * +* n/a * slower",
            "no interval with 5 pairs: a 95% interval of the median ratio would "
            "span the most extreme pairs*; 7 pairs or more give one*",
            "pytest-mps A/B: 1 benchmark compared: 1 slower, 0 faster, 0 same",
            # pytest's own last line counts them too
            "=* 1 slower in *",
        ]
    )
    found = json.loads((repo.path / "ab.json").read_text())
    record = found["benchmarks"]["test_b.py::test_work"]
    assert len(record["base_medians"]) == len(record["here_medians"]) == 5
    # every pair read six times the work, block by block
    assert len(record["pair_ratios"]) == 5
    assert all(r > 2 for r in record["pair_ratios"])
    # and the blocks behind each pair's ratio are kept, both sides
    assert len(record["pair_blocks"]) == 5
    for base_blocks, here_blocks in record["pair_blocks"]:
        assert len(base_blocks) == len(here_blocks) == 10
        assert sorted(here_blocks)[5] > 2 * sorted(base_blocks)[5]
    assert record["p"] == 1 / 32
    assert record["verdict"] == "slower" and record["ratio"] > 2
    # five pairs: no interval (see pairs.MIN_PAIRS_FOR_INTERVAL)
    assert record["ratio_ci95"] is None
    assert found["dirty"][0] == "pkg/__init__.py"
    # the plain test is not a benchmark: it ran on neither side
    assert list(found["benchmarks"]) == ["test_b.py::test_work"]


def test_a_benchmark_on_one_side_only_is_said_and_fails(repo: pytest.Pytester) -> None:
    (repo.path / "test_new.py").write_text(
        "import pytest\n\n\n@pytest.mark.mps_benchmark\n"
        "def test_new(mps_benchmark):\n    mps_benchmark(lambda: None)\n"
    )
    result = repo.runpytest_subprocess(
        *FAST, "--mps-benchmark-compare-rev=HEAD", "--mps-benchmark-compare-processes=5"
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
            ("--mps-benchmark-compare-rev=HEAD", "--mps-benchmark-compare-processes=4"),
            "ERROR: --mps-benchmark-compare-processes: at least 5 processes a side*",
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


def test_the_turns_alternate_until_each_worker_exits() -> None:
    # Two real workers (the baton's own client in child processes) asking for
    # 3 and 5 turns: the controller alternates, then serves the one left.
    script = (
        "import sys\n"
        "from pytest_mps.benchmark import baton\n"
        "turns = baton.current()\n"
        "for _ in range(int(sys.argv[1])):\n"
        "    turns.take()\n"
    )
    workers, processes = [], []
    for label, count in (("A", 3), ("B", 5)):
        worker = baton.Worker(label)
        env = {**os.environ, baton.ENV: worker.env_value}
        processes.append(
            subprocess.Popen(
                [sys.executable, "-c", script, str(count)],
                env=env,
                pass_fds=worker.child_fds,
            )
        )
        worker.started()
        workers.append(worker)
    turns = baton.serve(workers)
    for worker in workers:
        worker.close()
    assert [p.wait() for p in processes] == [0, 0]
    assert "".join(turns) == "ABABABBB"


def test_a_worker_has_no_turn_outside_the_gate() -> None:
    assert baton.ENV not in os.environ
    assert baton.current() is None


def test_same_ratios_are_same_and_a_clear_shift_is_slower() -> None:
    around_one = [1.00, 1.02, 0.99, 1.01, 0.995]
    ratio, low, high, p, slower, faster = pairs.compare(around_one, 0.05)
    assert not slower and not faster and p > 0.05
    assert low <= ratio <= high
    shifted = [v * 1.2 for v in around_one]
    ratio, low, high, p, slower, faster = pairs.compare(shifted, 0.05)
    assert slower and not faster and p == 1 / 32
    assert low <= ratio <= high and low > 1
    # every pair slower, but under the floor: not a regression
    small = [v * 1.03 + 0.02 for v in around_one]
    assert not pairs.compare(small, 0.05)[4]
    # faster on every pair: improved, never slower
    assert pairs.compare([1 / v for v in shifted], 0.05)[5]


def test_signed_rank_p_values_are_wilcoxons() -> None:
    # five pairs all above: 1/32; one of five below with the smallest size:
    # rank sum 14 of 15, reached by 2 of the 32 sign patterns
    assert pairs.signed_rank([0.1, 0.2, 0.3, 0.4, 0.5]) == (1 / 32, 1.0)
    assert pairs.signed_rank([-0.1, 0.2, 0.3, 0.4, 0.5])[0] == 2 / 32
    above, below = pairs.signed_rank([0.1, -0.2, 0.3, -0.4, 0.5])
    assert above + below >= 1 and 0.2 < above < 0.8


def test_pairs_are_matched_by_index_and_block_by_block() -> None:
    base = {0: [1.0, 2.0, 1.0], 1: [1.0, 1.0, 1.0], 3: [1.0]}
    here = {0: [1.1, 2.2, 1.1], 1: [2.0, 2.0, 2.0], 2: [5.0]}
    # block by block, the host's slow block (2.0) is matched with its partner
    assert pairs.pair_ratios(base, here) == pytest.approx([1.1, 2.0])


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")
def test_blocks_run_on_the_pairs_core_and_the_thread_gets_its_cores_back() -> None:
    cores = os.sched_getaffinity(0)
    read_fd, write_fd = os.pipe()
    turns = baton.Baton(read_fd, write_fd, cpu=max(cores))
    with turns.pinned():
        assert os.sched_getaffinity(0) == {max(cores)}
    assert os.sched_getaffinity(0) == cores
    # the controller hands both workers of a pair the same core
    worker = baton.Worker("A", baton.shared_cpu())
    assert worker.env_value.split(",")[2] == str(min(cores))
    for fd in worker.child_fds:
        os.close(fd)


def test_outside_a_git_repository_the_gate_is_one_usage_line(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_b=TESTS.replace("from pkg import work", "work = len"))
    result = pytester.runpytest_subprocess(
        *FAST, "--mps-benchmark-compare-rev=HEAD", "-p", "no:cacheprovider"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: --mps-benchmark-compare-rev: * is not inside a git repository; "
            "it measures a revision of the repository the tests are in beside its "
            "working tree (run pytest from the repository)"
        ]
    )
    assert "fatal:" not in result.stderr.str() + result.stdout.str()


def test_seven_pairs_give_an_interval_and_fewer_none() -> None:
    def outcome(count: int) -> ab.Outcome:
        ratios = tuple(1.0 + 0.01 * i for i in range(count))
        ratio, low, high, p, slower, faster = pairs.compare(ratios, 0.05)
        return ab.Outcome("t", (), (), ratios, ratio, low, high, p, slower, faster)

    assert not outcome(5).has_interval and outcome(5).as_dict()["ratio_ci95"] is None
    assert not outcome(6).has_interval
    seven = outcome(7)
    assert seven.has_interval
    low, high = seven.as_dict()["ratio_ci95"]
    # the two most extreme Walsh averages at each end are left out
    assert 1.0 < low <= seven.ratio <= high < 1.06
