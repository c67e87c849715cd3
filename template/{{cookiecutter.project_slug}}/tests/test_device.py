import pytest
import torch

from {{ cookiecutter.package_name }}.device import (
    make_runtime,
    peak_flops_for,
    pick_compile,
    pick_device,
    pick_dtype,
)
from {{ cookiecutter.package_name }}.errors import DeviceError


def test_auto_picks_mps_then_cuda_then_cpu():
    if torch.backends.mps.is_available():
        expected = "mps"
    elif torch.cuda.is_available():
        expected = "cuda"
    else:
        expected = "cpu"
    assert pick_device("auto").type == expected


def test_asking_for_missing_mps_says_why():
    if torch.backends.mps.is_available():
        pytest.skip("torch says MPS is available (a Mac, or pytest --mps-emulate)")
    with pytest.raises(DeviceError, match="--device=mps: MPS is not available here"):
        pick_device("mps")


def test_the_cpu_trains_in_float32_without_compile():
    runtime = make_runtime("cpu", "auto", "auto")
    assert (runtime.dtype, runtime.compile) == (torch.float32, False)
    assert "float32" in runtime.describe()


def test_compile_is_on_by_default_only_on_cuda():
    assert pick_compile(torch.device("cuda"), "auto")
    assert not pick_compile(torch.device("mps"), "auto")
    assert pick_compile(torch.device("mps"), "true")


def test_autocast_is_used_on_the_gpu(device):
    if device.type == "cpu":
        assert pick_dtype(device) == torch.float32
    else:
        assert pick_dtype(device) in (torch.bfloat16, torch.float16)


@pytest.mark.parametrize(
    ("kind", "name", "dtype", "tflops"),
    [
        ("cuda", "NVIDIA H100 80GB HBM3", torch.bfloat16, 989.5),
        ("cuda", "NVIDIA H100 PCIe", torch.bfloat16, 756.0),
        ("cuda", "NVIDIA A100-SXM4-40GB", torch.float32, 156.0),
        ("mps", "Apple M3 Max (40 GPU cores)", torch.float16, 16.4),
        ("mps", "Apple M1 (8 GPU cores)", torch.float32, 2.616),
    ],
)
def test_peak_flops_come_from_the_table(kind, name, dtype, tflops):
    assert peak_flops_for(kind, name, dtype) == pytest.approx(tflops * 1e12)


@pytest.mark.parametrize(
    ("kind", "name", "dtype"),
    [
        ("cpu", "x86_64", torch.float32),
        ("cuda", "Some Future GPU", torch.bfloat16),
        ("cuda", "Tesla V100-SXM2-16GB", torch.bfloat16),  # no bfloat16 units
        ("mps", "Apple M3 Max", torch.float16),  # core count unknown
    ],
)
def test_unknown_peaks_stay_unknown(kind, name, dtype):
    assert peak_flops_for(kind, name, dtype) is None
