"""A fixed corpus of small MPS cases, run for real and under the emulation.

Each case is one test of a file the self-check writes; the same file runs
with ``--mps`` (where MPS is available) and with ``--mps-emulate``, and each
case's outcome (passed, or the exception's type and first line) is compared:
the emulated outcome is what pytest-mps expects a Mac to do, the real one
what this Mac did. The cases are the behaviours the emulation was built
from (PyTorch's MPS sources and ``test_mps.py``): a float64 tensor, a host
read, mixed devices, an argument a kernel refuses, an op that may have no
MPS kernel, bfloat16, and plain ops that must run.
"""

from __future__ import annotations

#: (id, body): each body runs with ``device`` (a ``torch.device``) and torch.
CASES: tuple[tuple[str, str], ...] = (
    ("matmul_float32", "a = torch.randn(64, 64, device=device)\n(a @ a).sum().item()"),
    (
        "conv2d_float32",
        "x = torch.randn(1, 3, 16, 16, device=device)\n"
        "w = torch.randn(4, 3, 3, 3, device=device)\n"
        "torch.nn.functional.conv2d(x, w).sum().item()",
    ),
    ("float64_tensor", "torch.ones(2, dtype=torch.float64, device=device)"),
    ("numpy_of_device_tensor", "torch.ones(2, device=device).numpy()"),
    ("mixed_devices", "torch.ones(2, device=device) + torch.ones(2)"),
    (
        "grid_sample_border",
        "x = torch.randn(1, 1, 4, 4, device=device)\n"
        "g = torch.zeros(1, 2, 2, 2, device=device)\n"
        "torch.nn.functional.grid_sample(x, g, padding_mode='border', "
        "align_corners=False).sum().item()",
    ),
    (
        "adaptive_pool_not_divisible",
        "x = torch.randn(1, 1, 7, 7, device=device)\n"
        "torch.nn.functional.adaptive_avg_pool2d(x, 3).sum().item()",
    ),
    (
        "linalg_eigvals",
        "torch.linalg.eigvals(torch.randn(3, 3, device=device)).abs().sum().item()",
    ),
    (
        "bfloat16_matmul",
        "a = torch.randn(8, 8, device=device, dtype=torch.bfloat16)\n"
        "(a @ a).float().sum().item()",
    ),
    ("int64_cumsum", "torch.arange(10, device=device).cumsum(0).sum().item()"),
)


def test_file() -> str:
    """The corpus as a pytest file (one test per case, ids as in :data:`CASES`)."""
    lines = ["import pytest", "import torch", "", ""]
    for name, body in CASES:
        lines.append(f"def test_{name}(device):")
        lines += [f"    {line}" for line in body.splitlines()]
        lines += ["", ""]
    return "\n".join(lines).rstrip() + "\n"
