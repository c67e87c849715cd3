"""The 'seed' fixture and --mps-seed."""

from __future__ import annotations

import pytest

SEED_TESTS = """
import random
import numpy as np
import torch

def test_draw(seed, device):
    print("SEED", seed, random.random(), float(np.random.rand()),
          float(torch.rand(1, device=device)))

def test_fails(seed):
    assert False
"""


def _draws(result: pytest.RunResult) -> list[str]:
    # with -s the print lands on the progress line: "test_x.py SEED 1 ...".
    return [line[line.index("SEED ") :] for line in result.outlines if "SEED " in line]


def test_seed_is_stable_across_runs_and_printed_on_failure(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(SEED_TESTS)
    first = pytester.runpytest("-s")
    second = pytester.runpytest("-s")
    first.assert_outcomes(passed=1, failed=1)
    assert _draws(first) == _draws(second)
    assert len(_draws(first)) == 1
    first.stdout.fnmatch_lines(
        ["*- pytest-mps seed -*", "seed * rerun with --mps-seed=*"]
    )


def test_mps_seed_fixes_the_seed_and_reproduces_the_draws(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(SEED_TESTS)
    result = pytester.runpytest("-s", "--mps-seed=1234")
    (line,) = _draws(result)
    assert line.split()[1] == "1234"
    again = pytester.runpytest("-s", "--mps-seed", "1234")
    assert _draws(again) == [line]
    result.stdout.fnmatch_lines(["seed 1234: rerun with --mps-seed=1234"])


def test_seed_restores_the_global_generators_after_the_test(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import random
        import torch

        def test_a(seed):
            random.random(); torch.rand(1)

        def test_b():
            state = random.getstate()
            torch_state = torch.random.get_rng_state()
            assert state == pytest_state[0]
            assert torch.equal(torch_state, pytest_state[1])

        pytest_state = (random.getstate(), torch.random.get_rng_state())
        """
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=2)


@pytest.mark.parametrize("value", ["abc", "-1", str(2**32)])
def test_bad_seed_is_a_usage_error_naming_flag_and_value(
    pytester: pytest.Pytester, value: str
) -> None:
    pytester.makepyfile(SEED_TESTS)
    result = pytester.runpytest(f"--mps-seed={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --mps-seed: {value!r} *"])


def test_bad_ini_seed_names_the_ini_file(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmps_seed = lucky\n")
    pytester.makepyfile(SEED_TESTS)
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*ini option mps_seed in *tox.ini: 'lucky' is not a seed*"]
    )


def test_random_seed_is_reported_so_a_failure_can_be_rerun(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(SEED_TESTS)
    result = pytester.runpytest("-s", "--mps-seed=random")
    (line,) = _draws(result)
    seed = line.split()[1]
    result.stdout.fnmatch_lines([f"seed {seed}: rerun with --mps-seed={seed}"])
    again = pytester.runpytest("-s", f"--mps-seed={seed}")
    assert _draws(again) == [line]
