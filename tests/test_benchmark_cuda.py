"""A real CUDA run: events, memory, verdicts and the device table on a GPU.

Skipped where CUDA is not available (CI); run on the lent GPU.
"""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU"
)

FAST = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest")

MATMUL = """
import time
import torch

def test_mm(mps_benchmark, device):
    n = 2048
    a = torch.randn(n, n, device=device)
    out = mps_benchmark(torch.mm, a, a)
    assert out.shape == (n, n)
    if device.type == "cuda":
        reads = []
        for _ in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            torch.mm(a, a)
            reads.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        # The synced median is the real time; an unsynced timer reads less.
        assert sorted(reads)[2] < mps_benchmark.stats.median / 3
        assert mps_benchmark.result.verdict == "device-bound"
        assert mps_benchmark.result.events_agree is True
        assert mps_benchmark.result.peak_memory >= 3 * n * n * 4

def test_host_heavy(mps_benchmark, device):
    x = torch.ones(8, device=device)

    def step():
        sum(range(3000))  # Python work the device waits for
        return x.add_(1)

    mps_benchmark(step)
    if device.type == "cuda":
        assert mps_benchmark.result.verdict == "host-bound"
        assert mps_benchmark.result.dispatch_ratio > 0.9
"""


def test_cuda_benchmarks_on_the_gpu_and_beside_the_cpu(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(MATMUL)
    result = pytester.runpytest(
        *FAST,
        "--mps-benchmark-devices=cpu,cuda",
        "--mps-benchmark-max-time=0.3",
        "--mps-benchmark-json=out.json",
    )
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(
        [
            "*Events median*Peak memory*",
            "*pytest-mps device comparison: speedup vs cpu*",
            "test_mm *x)*",
        ]
    )
    doc = json.loads((pytester.path / "out.json").read_text())
    gpus = doc["machine_info"]["gpus"]
    assert gpus and gpus[0]["capability"]
    assert doc["machine_info"]["machine_key"].endswith(
        gpus[0]["name"].replace(" ", "_")
    )
    cuda = [b for b in doc["benchmarks"] if b["extra_info"]["device"] == "cuda:0"]
    assert len(cuda) == 2
    assert all(b["extra_info"]["device_time_median"] > 0 for b in cuda)


def test_a_test_without_the_device_fixture_syncs_the_cuda_it_started(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import torch

        def test_mm(mps_benchmark):
            a = torch.randn(4096, 4096, device="cuda")
            mps_benchmark(torch.mm, a, a)
            assert mps_benchmark.device == "cuda:0"
            assert mps_benchmark.stats.median > 100e-6  # ~0.14 TFLOP: not 10 us
        """
    )
    result = pytester.runpytest(*FAST, "--mps-benchmark-max-time=0.2")
    result.assert_outcomes(passed=1)
