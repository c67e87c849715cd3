"""A failing parity check names the first device op that is wrong on its own inputs.

The wrong kernel is a user's dispatch mode that changes one aten op's output
when an input is on the device, the shape of the MPS bugs users met (a
kernel wrong for one op, in the forward or only in the backward, or only
for non-contiguous inputs). The device is the emulated one, the reference
the CPU. Below the emulation's function mode a device tensor is a CPU tensor
whose storage carries the device's tag, so the mode asks for the tag.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

MUTANT = """
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from pytest_mps import assert_device_parity
from pytest_mps.emulate.tags import tagged
from pytest_mps.parity.check import ParityError


class WrongOnDevice(TorchDispatchMode):
    # one op's output made 5% larger on the device only
    def __init__(self, op, when=lambda args: True):
        super().__init__()
        self.op, self.when = op, when

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if func is self.op and self.when(args):
            if any(t.device.type != "cpu" or tagged(t) for t in tensors):
                if isinstance(out, tuple):
                    return (out[0] * 1.05, *out[1:])
                return out * 1.05
        return out


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 16)
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.fc(x))
        return self.head(self.norm(h))
"""


def _line(text: str) -> int:
    """The line of test_net.py (MUTANT, then the test) that holds ``text``."""
    lines = MUTANT.strip("\n").splitlines()  # makepyfile drops the first newline
    return next(i for i, line in enumerate(lines, 1) if text in line)


GELU = _line("gelu(")
NORM = _line("self.norm(h)")
FC = _line("self.fc(x)")


def _run(pytester: pytest.Pytester, body: str, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_net=MUTANT + body)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)


def test_a_forward_op_wrong_on_the_device_is_named_with_its_layer_and_line(
    pytester: pytest.Pytester,
) -> None:
    result = _run(
        pytester,
        """
def test_net():
    torch.manual_seed(0)
    net, x = Net(), torch.randn(4, 8)
    with WrongOnDevice(torch.ops.aten.gelu.default):
        assert_device_parity(net, x, device="mps")
""",
        "--mps-emulate",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E  * localized: the device side ran again with the test's seed; each of "
            "its * aten ops was run again on the cpu from the inputs it had on mps:0 "
            "(* compared)",
            "E  *   first op out of tolerance: aten.gelu.default (op * of *, forward) "
            f"in layer net (Net), called at test_net.py:{GELU}",
            "E  *     self: float32 (4, 16) strides (16, 1) (contiguous)",
            "E  *     output: float32 (4, 16) strides (16, 1) (contiguous): */64 "
            "elements out of tolerance, worst at (*, *): mps:0 *, cpu * (|diff| *, "
            "allowed *)",
        ]
    )
    # one wrong op, one first op: the ops after it inherit, they are not named
    result.stdout.no_fnmatch_line("*also out of tolerance*")
    result.stdout.no_fnmatch_line("*rerun*differs*")


def test_a_backward_op_wrong_on_the_device_is_put_back_at_its_forward_call(
    pytester: pytest.Pytester,
) -> None:
    result = _run(
        pytester,
        """
def test_net():
    torch.manual_seed(0)
    net, x = Net(), torch.randn(4, 8)
    with WrongOnDevice(torch.ops.aten.native_layer_norm_backward.default):
        assert_device_parity(net, x, device="mps")
""",
        "--mps-emulate",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E  *ParityError: assert_device_parity: * leaves differ between the "
            "reference (cpu) and the device (mps:0)",
            "E  *   first op out of tolerance: aten.native_layer_norm_backward.default "
            "(op * of *, backward) in layer net.norm (LayerNorm), the backward of "
            f"the call at test_net.py:{NORM}",
            "E  *     grad_out: float32 (4, 16) strides (16, 1) (contiguous)",
        ]
    )
    # the forward was right: the output leaf is not in the table
    result.stdout.no_fnmatch_line("E  * output  *float32*")


def test_a_kernel_wrong_only_for_non_contiguous_inputs_is_localized_in_its_layout(
    pytester: pytest.Pytester,
) -> None:
    result = _run(
        pytester,
        """
def test_net():
    torch.manual_seed(0)
    net, x = Net(), torch.randn(4, 8)
    strided = lambda args: not args[1].is_contiguous()  # addmm's mat1
    with WrongOnDevice(torch.ops.aten.addmm.default, strided):
        assert_device_parity(net, x, device="mps", layouts=True)
""",
        "--mps-emulate",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E  *ParityError: assert_device_parity: layout transposed*",
            "E  *   first op out of tolerance: aten.addmm.default (op * of *, forward) "
            "in layer net.fc (Linear), called at "
            f"test_net.py:{FC}",
            "E  *     mat1: float32 (4, 8) strides (1, 4) (non-contiguous)",
        ]
    )


def test_a_passing_check_never_localizes(pytester: pytest.Pytester) -> None:
    result = _run(
        pytester,
        """
import pytest_mps.parity.localize as localize

def test_net(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("localized a passing check")

    monkeypatch.setattr(localize.Recorder, "op", refuse)
    torch.manual_seed(0)
    report = assert_device_parity(Net(), torch.randn(4, 8), device="mps")
    assert report.localization is None
""",
        "--mps-emulate",
    )
    result.assert_outcomes(passed=1)


def test_the_report_carries_the_localization(pytester: pytest.Pytester) -> None:
    result = _run(
        pytester,
        """
def test_net():
    torch.manual_seed(0)
    net, x = Net(), torch.randn(4, 8)
    with WrongOnDevice(torch.ops.aten.gelu.default):
        try:
            assert_device_parity(net, x, device="mps")
        except ParityError as error:
            found = error.report.localization
    assert found.first.op == "aten.gelu.default"
    assert found.first.site.module == "net"
    assert found.first.site.phase == "forward"
    assert found.wrong_count == 1
    assert found.replayed > 10
""",
        "--mps-emulate",
    )
    result.assert_outcomes(passed=1)


def test_error_that_builds_up_over_ops_is_told_from_one_wrong_op(
    pytester: pytest.Pytester,
) -> None:
    # float32 against a float64 reference: each op is what the CPU computes in
    # float32, the difference comes from the sum of their roundings
    result = _run(
        pytester,
        """
def cancel(x):
    return ((x + 1e4) - 1e4) * 100


def test_cancel():
    x = torch.linspace(-1, 1, 64)
    assert_device_parity(
        cancel, x, device="cpu", reference_dtype=torch.float64, grads=False
    )
""",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E  * localized: * aten ops was run again on the cpu from the inputs "
            "it had on cpu (* compared)",
            "E  *   no op leaves its tolerance on its own inputs, and no layer with "
            "what it was given within it: the difference builds up over many ops",
        ]
    )


def test_a_layer_whose_code_takes_another_path_on_the_device_is_named(
    pytester: pytest.Pytester,
) -> None:
    # every op is right on its own inputs: the layer runs other ops on mps
    result = _run(
        pytester,
        """
class Scaled(nn.Module):
    def forward(self, x):
        return x * (1.05 if x.device.type == "mps" else 1.0)


def test_net():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), Scaled(), nn.Linear(16, 4))
    assert_device_parity(net, torch.randn(4, 8), device="mps")
""",
        "--mps-emulate",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E  *   first layer out of tolerance with its inputs within it: net.1 "
            "(Scaled), forward: output 0 64/64 elements out (max |diff| *)",
            "E  *   no op in it leaves its tolerance on its own inputs: it runs "
            "other ops on the device (code that depends on the device), or the "
            "difference builds up over its ops",
        ]
    )


def test_a_device_that_answers_twice_differently_is_named(
    pytester: pytest.Pytester,
) -> None:
    result = _run(
        pytester,
        """
import itertools

calls = itertools.count()


def drifting(x):
    # the device's first run is off; its rerun is not
    return x * 2 + (1e-2 if next(calls) == 1 else 0.0)


def test_drift():
    assert_device_parity(drifting, torch.ones(3), device="cpu", grads=False)
""",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E  *   the rerun on cpu differs from its first run (same inputs, same "
            "seed): output; its results depend on the run, not only on the inputs",
        ]
    )


def test_a_cuda_only_kernel_is_replayed_through_its_cpu_equivalent(
    pytester: pytest.Pytester,
) -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: cudnn_batch_norm runs only there")
    result = _run(
        pytester,
        """
def test_conv():
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
    x = torch.randn(2, 3, 8, 8)
    with WrongOnDevice(torch.ops.aten.cudnn_batch_norm_backward.default):
        assert_device_parity(net, x, device="cuda")
""",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E  *   first op out of tolerance: aten.cudnn_batch_norm_backward.default "
            "(op * of *, backward) in layer net.1 (BatchNorm2d), the backward of "
            "the call at test_net.py:*",
        ]
    )


def test_a_submodule_whose_forward_hook_changes_it_on_the_device_is_named(
    pytester: pytest.Pytester,
) -> None:
    # the user's hook changes fc1's output on the device: the model receives
    # the hooked output, so the layer judged must be fc1, not its parent
    result = _run(
        pytester,
        """
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 16)
        self.fc2 = nn.Linear(16, 16)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def on_device_only(module, args, output):
    return output * 1.05 if output.device.type == "mps" else output


def test_net():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), Block(), nn.Linear(16, 4))
    net[1].fc1.register_forward_hook(on_device_only)
    assert_device_parity(net, torch.randn(4, 8), device="mps")
""",
        "--mps-emulate",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E  *   first layer out of tolerance with its inputs within it: "
            "net.1.fc1 (Linear), forward: output 0 *",
        ]
    )
