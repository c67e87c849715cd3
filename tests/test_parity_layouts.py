"""assert_device_parity(..., layouts=True): the same values in other memory layouts.

The injected bug reads its input as if it were contiguous, as the MPS kernels
of pytorch#124834 and #118115 did: right on contiguous inputs, wrong on the
transposed and strided ones. This machine has only a CPU, so the bug lives in
the module, and the device side is the CPU.
"""

from __future__ import annotations

import platform

import pytest
import torch

# Optimizers import torch._dynamo lazily (see tests/test_parity.py).
import torch._dynamo  # noqa: F401
from torch import nn

from pytest_mps import assert_device_parity
from pytest_mps.parity.check import ParityError

pytest_plugins = ["pytester"]


def as_if_contiguous(x: torch.Tensor) -> torch.Tensor:
    """``x``'s memory read in row-major order: the bug class under test."""
    strides, step = [], 1
    for size in reversed(x.shape):
        strides.insert(0, step)
        step *= size
    return x.as_strided(x.shape, strides, x.storage_offset())


class ContiguousOnly(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(as_if_contiguous(x))


def test_a_module_wrong_on_non_contiguous_inputs_fails_naming_each_layout() -> None:
    torch.manual_seed(0)
    # passes as it always did: the contiguous run matches
    assert_device_parity(ContiguousOnly(), torch.randn(5, 6), device="cpu")
    with pytest.raises(ParityError) as info:
        assert_device_parity(
            ContiguousOnly(), torch.randn(5, 6), device="cpu", layouts=True
        )
    message = str(info.value)
    first = message.splitlines()[0]
    assert first == (
        "assert_device_parity: layout transposed (each input's last two dims "
        "swapped in memory) gives other results on cpu: 3 of 4 leaves differ "
        "from the contiguous run, 3 of 4 from the reference"
    )
    assert message.splitlines()[1] == (
        "  (wrong results on non-contiguous inputs are a known MPS bug class: "
        "pytorch#124834, #118115; Conv3d #197114; bmm past 2**32 elements "
        "#197636)"
    )
    assert "layout strided (each input a slice of every other element)" in message
    assert "output" in message and "inputs[0].grad" in message
    assert set(info.value.report.layouts) == {"transposed", "strided"}


def test_a_correct_module_passes_in_every_layout_and_the_run_says_which(
    capsys: pytest.CaptureFixture[str],
) -> None:
    torch.manual_seed(0)
    report = assert_device_parity(
        nn.Linear(6, 4), torch.randn(5, 6), device="cpu", layouts=True, steps=1
    )
    assert set(report.layouts) == {"transposed", "strided"}
    assert all(d.ok for diffs in report.layouts.values() for d in diffs)
    assert (
        "assert_device_parity: layouts run again on the device: transposed, strided"
        in capsys.readouterr().out
    )


class ChannelsLastBug(nn.Module):
    """A conv net whose forward mishandles channels_last inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_contiguous(memory_format=torch.channels_last) and x.size(1) > 1:
            x = as_if_contiguous(x)
        return self.conv(x)


def test_channels_last_runs_for_4d_inputs_and_names_its_bug() -> None:
    torch.manual_seed(0)
    images = torch.randn(2, 3, 5, 5)
    report = assert_device_parity(
        nn.Conv2d(3, 4, 3), images, device="cpu", layouts=True
    )
    assert set(report.layouts) == {"transposed", "strided", "channels_last"}
    with pytest.raises(ParityError) as info:
        assert_device_parity(ChannelsLastBug(), images, device="cpu", layouts=True)
    lines = str(info.value).splitlines()
    assert lines[0].startswith(
        "assert_device_parity: layout channels_last (4-d inputs and weights in "
        "torch.channels_last) gives other results on cpu: "
    )
    assert not any(line.startswith("layout transposed") for line in lines)


def test_channels_last_3d_runs_for_5d_inputs() -> None:
    torch.manual_seed(0)
    report = assert_device_parity(
        nn.Conv3d(2, 2, 1), torch.randn(1, 2, 3, 3, 3), device="cpu", layouts=True
    )
    assert "channels_last_3d" in report.layouts


def test_the_device_parity_fixture_takes_layouts(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import torch

        def test_layouts(device_parity):
            report = device_parity(torch.nn.Linear(3, 2), torch.randn(4, 3),
                                   layouts=True)
            assert sorted(report.layouts) == ["strided", "transposed"]
        """
    )
    pytester.runpytest().assert_outcomes(passed=1)


@pytest.mark.skipif(
    torch.backends.mps.is_built(), reason="this torch has MPS: device='mps' runs"
)
def test_a_device_not_here_skips_in_one_line_without_the_helpers_source(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import torch
        from pytest_mps import assert_device_parity

        def test_on_mps():
            assert_device_parity(torch.nn.Linear(2, 2), torch.ones(1, 2), device="mps")
        """
    )
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=1)
    reason = (
        "assert_device_parity: device='mps' is not usable here: this torch has no "
        f"MPS (it needs an Apple-silicon Mac; this is {platform.system()})"
    )
    result.stdout.fnmatch_lines([f"SKIPPED [[]1] test_*.py:5: {reason}"])
    assert len(reason) < 130
    result.stdout.no_fnmatch_line("*parity/check.py*")
    result.stdout.no_fnmatch_line("*Traceback*")


def test_the_tolerance_note_says_what_scale_is(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert_device_parity(nn.Linear(2, 2), torch.ones(1, 2), device="cpu")
    notes = [line for line in capsys.readouterr().out.splitlines() if "float32" in line]
    assert notes == [
        "assert_device_parity: float32: |device - reference| <= 1.0e-05 x scale + "
        "1.3e-06 x |reference|, scale = the leaf's largest |reference|, at least 1 "
        "(torch.testing.assert_close's default)"
    ]
    assert len(notes[0]) < 200


def test_an_error_in_a_layout_run_names_the_layout(pytester: pytest.Pytester) -> None:
    # .view needs contiguous memory: the transposed and strided runs raise
    pytester.makepyfile(
        """
        import torch
        from pytest_mps import assert_device_parity

        def test_view():
            x = torch.randn(3, 4)
            assert_device_parity(lambda t: t.view(-1) * 2, x, device="cpu",
                                 layouts=True)
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    message = (
        "E *pytest_mps.parity.check.ParityError: assert_device_parity: layout "
        "transposed (each input's last two dims swapped in memory) raises on cpu: "
        "RuntimeError: view size is not compatible with input tensor's size and "
        "stride *"
    )
    result.stdout.fnmatch_lines([message])
    result.stdout.fnmatch_lines(["*direct cause of the following exception*"])
    result.stdout.no_fnmatch_line("*parity/check.py*")
