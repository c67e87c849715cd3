"""Device, precision and compile choices, and the peak-FLOPS table behind MFU.

What differs from nanoGPT on a Mac: autocast really runs on MPS (nanoGPT passes
device_type='cpu' there and trains in float32), nothing is pinned (pinned memory
is a CUDA notion), torch.compile stays off by default (it measured slower than
eager on an M3 Max: 306 vs 221 ms/iter), and AdamW uses the fused kernel.
"""

from __future__ import annotations

import contextlib
import functools
import platform
import re
import subprocess
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from .errors import DeviceError

DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


@dataclass(frozen=True)
class Runtime:
    """Where and how the model runs."""

    device: torch.device
    dtype: torch.dtype  # autocast dtype; float32 means no autocast
    compile: bool

    @property
    def autocast(self) -> contextlib.AbstractContextManager[object]:
        """Mixed precision for the forward pass, or nothing on float32."""
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    @property
    def needs_grad_scaler(self) -> bool:
        """float16 gradients underflow without loss scaling; bfloat16's do not."""
        return self.dtype == torch.float16

    def describe(self) -> str:
        name = str(self.dtype).removeprefix("torch.")
        precision = name if self.dtype == torch.float32 else f"autocast {name}"
        return (
            f"{device_name(self.device)} ({self.device}), {precision},"
            f" compile {'on' if self.compile else 'off'}"
        )


def mps_available() -> bool:
    return torch.backends.mps.is_available()


def pick_device(name: str = "auto") -> torch.device:
    """auto: mps, else cuda, else cpu. An explicit choice must be available."""
    if name == "auto":
        if mps_available():
            return torch.device("mps")
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("cpu")
    device = torch.device(name)
    if device.type == "mps" and not mps_available():
        why = (
            "this PyTorch build has no MPS support"
            if not torch.backends.mps.is_built()
            else "MPS needs Apple silicon and macOS 12.3 or newer"
        )
        raise DeviceError(f"--device={name}: MPS is not available here ({why})")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"--device={name}: CUDA is not available here")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise DeviceError(
                f"--device={name}: only {torch.cuda.device_count()} CUDA device(s)"
            )
    return device


def _autocast_works(device: torch.device, dtype: torch.dtype) -> bool:
    # An unsupported dtype may only warn ("...Disabling autocast") and run float32:
    # that counts as not working.
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with torch.autocast(device.type, dtype=dtype):
                a = torch.ones(8, 8, device=device)
                return (a @ a).dtype == dtype
    except (RuntimeError, TypeError, UserWarning):
        return False


def pick_dtype(device: torch.device, name: str = "auto") -> torch.dtype:
    """auto: bfloat16 on CUDA and MPS where supported, else float16; float32 on CPU."""
    if name != "auto":
        dtype = DTYPES[name]
        if dtype != torch.float32 and not _autocast_works(device, dtype):
            raise DeviceError(
                f"--dtype={name}: autocast to {name} does not work on {device} with"
                f" PyTorch {torch.__version__}; use --dtype=float32"
            )
        return dtype
    if device.type == "cpu":
        return torch.float32  # CPU autocast mostly adds casts for small models
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return torch.float16
    # MPS: bfloat16 needs macOS 14; older systems get float16 with loss scaling.
    for dtype in (torch.bfloat16, torch.float16):
        if _autocast_works(device, dtype):
            return dtype
    return torch.float32


def pick_compile(device: torch.device, setting: str = "auto") -> bool:
    """auto: compile on CUDA only (on MPS it measured slower than eager)."""
    if setting == "auto":
        return device.type == "cuda"
    return setting == "true"


def make_runtime(device: str, dtype: str, compile: str) -> Runtime:
    dev = pick_device(device)
    return Runtime(dev, pick_dtype(dev, dtype), pick_compile(dev, compile))


def to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """Copy a whole token array to the device once, as int64 indices."""
    tensor = torch.from_numpy(array.astype(np.int64))
    if device.type == "cuda":
        # Pinned staging makes the copy asynchronous; MPS has no pinned memory.
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def synchronize(device: torch.device) -> None:
    """Wait for queued work, for timing (never inside the training step)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def _accelerator_peak(device: torch.device) -> int | None:
    """torch.accelerator's peak, where this torch keeps one for the device.

    CUDA has it; MPS from torch 2.15 (older ones raise, or answer no peak).
    """
    reader = getattr(getattr(torch, "accelerator", None), "memory_stats", None)
    if reader is None:
        return None
    try:
        stats = reader(device)
    except (RuntimeError, NotImplementedError, TypeError, ValueError):
        return None
    return stats.get("allocated_bytes.all.peak")


def peak_memory(device: torch.device) -> tuple[int, str] | None:
    """Peak bytes on the device and where that figure comes from; None on CPU."""
    peak = _accelerator_peak(device)
    if peak is not None:
        return int(peak), "the allocator's peak"
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "the allocator's peak"
    if device.type == "mps":
        # No peak counter before torch 2.15: what Metal's driver holds for the
        # allocator, which keeps freed blocks cached, so at least the peak of
        # the tensors alive at once (current_allocated_memory reads 0 after a
        # step: nanochat#838)
        return torch.mps.driver_allocated_memory(), "held by the MPS driver"
    return None


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "mps":
        return apple_chip() or "Apple GPU"
    return platform.processor() or platform.machine() or "CPU"


@functools.cache
def apple_chip() -> str | None:
    """'Apple M3 Max' and its GPU core count, e.g. 'Apple M3 Max (40 GPU cores)'."""
    try:
        brand = subprocess.run(
            ["sysctl", "-n", "machdep.cpu.brand_string"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        gpu = subprocess.run(
            ["system_profiler", "SPDisplaysDataType"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    cores = re.search(r"Total Number of Cores:\s*(\d+)", gpu)
    if not brand:
        return None
    return f"{brand} ({cores.group(1)} GPU cores)" if cores else brand


# Dense peak TFLOPS from the vendors' data sheets: (bfloat16, float16, float32).
# float32 on NVIDIA is TF32 tensor-core math, which training enables on CUDA.
# Longer names first: the first substring that matches the device name wins.
NVIDIA_PEAK_TFLOPS: tuple[tuple[str, tuple[float | None, float, float]], ...] = (
    ("H200", (989.5, 989.5, 494.7)),
    ("H100 PCIe", (756.0, 756.0, 378.0)),
    ("H100", (989.5, 989.5, 494.7)),  # SXM
    ("A100", (312.0, 312.0, 156.0)),
    ("L40S", (362.1, 362.1, 183.0)),
    ("L4", (121.0, 121.0, 60.0)),
    ("A10", (125.0, 125.0, 62.5)),
    ("RTX 4090", (165.2, 165.2, 82.6)),
    ("RTX 3090", (71.0, 71.0, 35.6)),
    ("V100", (None, 125.0, 15.7)),
    ("T4", (None, 65.0, 8.1)),
)
# Apple GPUs: float32 GFLOPS per GPU core (128 ALUs x 2 FLOPs x clock); float16
# and bfloat16 run at the same rate on these GPUs. Multiplied by the core count
# that system_profiler reports, since each chip ships with several core counts.
APPLE_GFLOPS_PER_CORE = {"M1": 327.0, "M2": 358.0, "M3": 410.0, "M4": 460.0}


def peak_flops(device: torch.device, dtype: torch.dtype) -> float | None:
    """Peak FLOP/s of `device` at `dtype`, or None when the table does not know it."""
    return peak_flops_for(device.type, device_name(device), dtype)


def peak_flops_for(kind: str, name: str, dtype: torch.dtype) -> float | None:
    """Look up a device by its type ('cuda', 'mps', 'cpu') and marketing name."""
    if kind == "cuda":
        column = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}[dtype]
        for key, peaks in NVIDIA_PEAK_TFLOPS:
            if key in name:
                peak = peaks[column]
                return None if peak is None else peak * 1e12
        return None
    if kind == "mps":
        chip = re.search(r"\b(M\d)\b.*\((\d+) GPU cores\)", name)
        if chip and chip.group(1) in APPLE_GFLOPS_PER_CORE:
            return APPLE_GFLOPS_PER_CORE[chip.group(1)] * int(chip.group(2)) * 1e9
    return None


@contextlib.contextmanager
def cuda_fast_matmul(device: torch.device) -> Iterator[None]:
    """TF32 matmuls on CUDA during training, restored afterwards."""
    if device.type != "cuda":
        yield
        return
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def make_generator(device: torch.device, seed: int) -> torch.Generator:
    """A seeded random stream on `device`, so drawing numbers never waits on the host.

    Falls back to a CPU generator where the backend has none of its own.
    """
    try:
        generator = torch.Generator(device=device)
    except RuntimeError:
        generator = torch.Generator()
    return generator.manual_seed(seed)


def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    """The global random states dropout draws from, for exact resume."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    elif device.type == "mps":
        state["mps"] = torch.mps.get_rng_state()
    return state


def set_rng_state(device: torch.device, state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
    elif device.type == "mps" and "mps" in state:
        torch.mps.set_rng_state(state["mps"])
