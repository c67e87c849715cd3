"""Repro bundles of failing parity checks: written, replayed, rerun in a fresh process.

Two failures of the emulated device: one comes from this process's state (a
dispatch mode the test leaves active makes ``gelu`` wrong on the device), one
from the code (a module that computes something else on mps). A fresh
process tells them apart; the CPU replays either bundle bit for bit.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

TESTS = """
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from pytest_mps import assert_device_parity
from pytest_mps.emulate.tags import tagged


class Wrong(TorchDispatchMode):
    # gelu 5% too large on the device, while this mode is active
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        on_device = any(isinstance(a, torch.Tensor) and tagged(a) for a in args)
        if func is torch.ops.aten.gelu.default and on_device:
            return out * 1.05
        return out


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(torch.nn.functional.gelu(self.fc(x)))


class OnMps(nn.Module):
    # another path on the device: wrong in any process
    def forward(self, x):
        return x * (1.05 if x.device.type == "mps" else 1.0)


def test_state():
    torch.manual_seed(0)
    with Wrong():
        assert_device_parity(Net(), torch.randn(4, 8), device="mps")


def test_code():
    torch.manual_seed(0)
    net = nn.Sequential(Net(), OnMps())
    assert_device_parity(net, torch.randn(4, 8), device="mps")


def test_passes():
    torch.manual_seed(0)
    assert_device_parity(Net(), torch.randn(4, 8), device="mps")


def test_lambda():
    assert_device_parity(lambda x: x.relu() * (1.1 if x.is_mps else 1.0),
                         torch.randn(3), device="mps", grads=False)
"""


def _replay(path: Path, *args: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest_mps.parity.replay", str(path), "--json", *args],
        capture_output=True,
        text=True,
        cwd=path.parent.parent,
        check=False,
    )
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_each_failing_check_writes_a_bundle_that_replays_bit_for_bit_on_the_cpu(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_two=TESTS)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--mps-emulate", "--mps-parity-bundle=bundles"
    )
    result.assert_outcomes(failed=3, passed=1)
    result.stdout.fnmatch_lines(
        [
            "E  * repro bundle: */bundles/test_two.py_test_state.mps-bundle.pt (Net on "
            "mps:0 against cpu, 1 inputs, seed 0, 6 leaves digested, written by "
            "torch * on *)",
            "E  * repro bundle not written: *(a module or function defined at the "
            "top level of a module can be saved; a lambda or a local class cannot)",
        ]
    )
    written = sorted(p.name for p in (pytester.path / "bundles").iterdir())
    assert written == [
        "test_two.py_test_code.mps-bundle.pt",
        "test_two.py_test_state.mps-bundle.pt",
    ]
    for name in written:
        on_cpu = _replay(pytester.path / "bundles" / name, "--device", "cpu")
        assert on_cpu["same_bits"] == {"reference": [6, 6]}, on_cpu
        assert on_cpu["failed"] is False
    # on its own device, in a process without the test's mode
    state = _replay(pytester.path / "bundles" / written[1])
    assert state["failed"] is False
    code = _replay(pytester.path / "bundles" / written[0])
    assert code["failed"] is True
    assert code["same_bits"] == {"reference": [6, 6], "device": [6, 6]}


def test_a_bundle_is_collected_as_a_test_that_fails_as_the_original(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_two=TESTS)
    first = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--mps-emulate", "--mps-parity-bundle=bundles",
        "-k", "code",
    )  # fmt: skip
    first.assert_outcomes(failed=1, deselected=3)
    again = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "bundles/test_two.py_test_code.mps-bundle.pt"
    )
    again.assert_outcomes(failed=1)
    again.stdout.fnmatch_lines(
        [
            "*assert_device_parity: 6 of 6 leaves differ between the reference "
            "(cpu) and the device (mps:0)*",
            "FAILED bundles/test_two.py_test_code.mps-bundle.pt::replay*",
        ]
    )


def test_a_fresh_process_tells_state_from_code(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_two=TESTS)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--mps-emulate", "--mps-parity-fresh",
        "-k", "state or code",
    )  # fmt: skip
    result.assert_outcomes(failed=2, deselected=2)
    result.stdout.fnmatch_lines(
        [
            "E  * fresh process: the check passes in a fresh process on mps:0: the "
            "failure depends on this process's state (*), not on the inputs alone",
            "E  * fresh process: the failure comes back in a fresh process on mps:0 "
            "(*): it does not depend on this process's state",
        ]
    )
    # without a bundle folder, none is left behind
    result.stdout.no_fnmatch_line("*repro bundle:*")


def test_without_the_options_nothing_is_written(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_two=TESTS)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--mps-emulate", "-k", "state"
    )
    result.assert_outcomes(failed=1, deselected=3)
    result.stdout.no_fnmatch_line("*bundle*")
    result.stdout.no_fnmatch_line("*fresh process*")
    assert not any(p.name.endswith(".mps-bundle.pt") for p in pytester.path.rglob("*"))


def test_a_file_that_is_not_a_bundle_is_named(tmp_path: Path) -> None:
    from pytest_mps import replay_bundle

    bad = tmp_path / "x.mps-bundle.pt"
    bad.write_text("not torch")
    with pytest.raises(ValueError, match=r"x.mps-bundle.pt: not a parity bundle"):
        replay_bundle(bad)
    with pytest.raises(FileNotFoundError, match=r"missing.pt: no such parity bundle"):
        replay_bundle(tmp_path / "missing.pt")
