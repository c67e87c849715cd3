"""What a failing emulated test touched that is not emulated, in one line.

A user's test file runs under ``--mps-emulate`` in a subprocess; each failing
test names what a Mac would have done otherwise (emulate/unreproduced.py),
and a test that touched none of it gets no such line.
"""

from __future__ import annotations

import pytest

LINE = "not emulated by pytest-mps (--mps-emulate computes on the CPU): "


def run_emulated(pytester: pytest.Pytester, *options: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(
        "--mps-emulate", *options, "-p", "no:cacheprovider"
    )


def failure_of(out: str, test: str) -> str:
    """The failure section of one test in pytest's output."""
    start = out.index(f"_ {test} _")
    end = out.find("\n___", start + 1)
    summary = out.find("short test summary", start)
    ends = [e for e in (end, summary) if e != -1]
    return out[start : min(ends)] if ends else out[start:]


def test_each_failure_names_what_it_touched(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_mac_recorded="""
        import subprocess, sys
        import torch
        import torch.nn.functional as F

        def test_half_sort_order():
            keys = torch.tensor([1.0, 2.0, 1.0, 1.0], dtype=torch.float16)
            order = torch.argsort(keys.to("mps"))
            assert order.tolist() == [3, 0, 2, 1]  # recorded on a Mac

        def test_repeated_index_writes():
            t = torch.zeros(3, device="mps")
            index = torch.tensor([0, 0, 1], device="mps")
            t.index_put_((index,), torch.tensor([1.0, 2.0, 3.0], device="mps"))
            assert t.tolist() == [1.0, 3.0, 0.0]  # a value recorded on a Mac

        def test_dropout_mask():
            torch.manual_seed(0)
            x = torch.ones(8, device="mps")
            assert F.dropout(x, 0.5).sum().item() == -1.0

        def test_attention_dropout():
            q = torch.ones(1, 2, 4, device="mps", requires_grad=True)
            out = F.scaled_dot_product_attention(q, q, q, dropout_p=0.3)
            assert out.sum().item() == 0

        def test_another_process():
            subprocess.run(
                [sys.executable, "-c", "import sys; sys.exit(3)"], check=True
            )

        def test_half_uniform():
            x = torch.rand(4, device="mps", dtype=torch.float16)
            assert (x > 2).all()

        def test_allocator_statistics():
            x = torch.ones(1024, device="mps")
            assert torch.mps.driver_allocated_memory() > 2**30

        def test_on_the_cpu_only():
            torch.manual_seed(0)
            assert torch.randn(3).sum().item() == 1.5
        """
    )
    result = run_emulated(pytester)
    result.assert_outcomes(failed=8)
    out = result.stdout.str()
    expected = {
        "test_half_sort_order": "the order MPS's argsort gives equal torch.float16 "
        "keys: without stable=True it is undefined",
        "test_repeated_index_writes": "the order of MPS's parallel index_put_ "
        "writes to repeated indices: a Mac keeps any one of them (pytorch#97574)",
        "test_dropout_mask": "MPS's random stream (dropout at ",
        "test_attention_dropout": "MPS's random stream (scaled_dot_product_"
        "attention with dropout_p=0.3 at ",
        "test_another_process": "another Python process (",
        "test_half_uniform": "MPS's random stream (rand in torch.float16 at ",
        "test_allocator_statistics": "the MPS allocator's statistics "
        "(torch.mps.driver_allocated_memory): here the bytes of the emulated "
        "device's live tensors",
    }
    for test, what in expected.items():
        failure = failure_of(out, test)
        assert "- pytest-mps emulate: not emulated -" in failure, failure
        assert LINE + what in failure, failure
        assert failure.count(LINE) == 1
    assert "test_mac_recorded.py:7)" in failure_of(out, "test_half_sort_order")
    assert "not emulated" not in failure_of(out, "test_on_the_cpu_only")


def test_a_draw_that_made_inputs_is_named_as_what_may_differ(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_inputs="""
        import torch

        def test_sums_a_draw():
            x = torch.randn(6, device="mps")
            assert x.sum().item() == 0.25
        """
    )
    result = run_emulated(pytester, "--junitxml=out.xml")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "not emulated" not in out
    result.stdout.fnmatch_lines(
        [
            "*- pytest-mps emulate: random numbers -*",
            "This test drew random numbers on the emulated device (randn at "
            "*test_inputs.py:4)*",
        ]
    )
    # the JUnit XML's failure text carries the line too
    assert "This test drew random numbers" in (pytester.path / "out.xml").read_text()


def test_a_mac_failure_that_passes_here_names_why(pytester: pytest.Pytester) -> None:
    # unittest's expectedFailure, as PyTorch's MPS lists mark tests
    pytester.makepyfile(
        test_marked="""
        import unittest
        import torch

        class TestOnMac(unittest.TestCase):
            @unittest.expectedFailure
            def test_sort_of_equal_half_keys(self):
                keys = torch.tensor([2.0, 1.0, 1.0], dtype=torch.float16)
                on_device = torch.sort(keys.to("mps")).indices.cpu()
                self.assertEqual(on_device.tolist(), torch.sort(keys).indices.tolist())

            @unittest.expectedFailure
            def test_nothing_unreproduced(self):
                self.assertEqual(torch.ones(1, device="mps").item(), 1.0)
        """
    )
    result = run_emulated(pytester)
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    sort = failure_of(out, "TestOnMac.test_sort_of_equal_half_keys")
    assert "Unexpected success" in sort
    assert LINE + "the order MPS's sort gives equal torch.float16 keys" in sort
    assert "not emulated" not in failure_of(out, "TestOnMac.test_nothing_unreproduced")


def test_passing_tests_and_plain_runs_get_no_line(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_fine="""
        import torch

        def test_sorts():
            keys = torch.tensor([2.0, 1.0, 1.0], dtype=torch.float16)
            assert torch.sort(keys.to("mps")).values.tolist() == [1.0, 1.0, 2.0]

        def test_fails_without_the_emulation():
            keys = torch.tensor([2.0, 1.0], dtype=torch.float16)
            assert torch.argsort(keys).tolist() == [0, 1]
        """
    )
    result = run_emulated(pytester)
    result.assert_outcomes(passed=1, failed=1)
    assert "not emulated" not in result.stdout.str()
    plain = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "without")
    plain.assert_outcomes(failed=1)
    assert "pytest-mps" not in plain.stdout.str()
