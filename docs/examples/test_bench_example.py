"""The benchmarks behind the README's table and box plot (docs/img/).

Run:  pytest docs/examples/test_bench_example.py --mps-benchmark-min-time=0.0001 \
          --mps-benchmark-max-time=0.5 --mps-benchmark-histogram=docs/img/bench
"""

import pytest
import torch

# The figures come from a 2-core machine shared with other work, where torch's
# second intra-op thread stalls for a scheduler slice whenever a core is taken.
torch.set_num_threads(1)


@pytest.mark.mps_benchmark(group="matmul")
@pytest.mark.parametrize("n", [32, 64, 128, 256])
def test_mm(mps_benchmark, n):
    a = torch.randn(n, n)
    mps_benchmark(torch.mm, a, a)


@pytest.mark.mps_benchmark(group="activations")
@pytest.mark.parametrize("name", ["gelu", "relu", "silu"])
def test_activation(mps_benchmark, name):
    x = torch.randn(1 << 16)
    mps_benchmark(getattr(torch.nn.functional, name), x)
