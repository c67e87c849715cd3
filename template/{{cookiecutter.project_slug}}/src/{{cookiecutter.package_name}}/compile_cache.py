"""Compiled code kept between runs: torch.compile's caches in the run folder.

torch.compile spends tens of seconds before the first step of a run (on an
H200, 16 s of a 20-iteration run's 44-50 s). Inductor keeps what it compiled
in TORCHINDUCTOR_CACHE_DIR (Triton's kernels, FX graphs, AOTAutograd's graphs)
and a later run with the same folder starts from it: the first step took
1.2-1.9 s instead of 16-17 s there. PyTorch's default folder lives in the
machine's temporary files; this puts it in the run folder instead, next to
the checkpoint, so it lasts as long as the run does and a CI cache can keep
it. A TORCHINDUCTOR_CACHE_DIR you set yourself is left as it is.
"""

from __future__ import annotations

import os
from pathlib import Path

VARIABLE = "TORCHINDUCTOR_CACHE_DIR"
#: The folder in out_dir that holds the cache.
FOLDER = "compile-cache"


def use(out_dir: str) -> tuple[Path, bool]:
    """Point torch.compile's caches at out_dir/compile-cache unless already set.

    Returns the folder in use and whether it already holds compiled code (a
    warm start). Call it before the first compiled call runs.
    """
    chosen = os.environ.get(VARIABLE)
    folder = Path(chosen) if chosen else (Path(out_dir) / FOLDER).resolve()
    warm = folder.is_dir() and any(folder.iterdir())
    if not chosen:
        os.environ[VARIABLE] = str(folder)
    return folder, warm


def describe(folder: Path, warm: bool) -> str:
    """One line for the log: where the cache is, and what it holds."""
    if warm:
        return f"compile cache: {folder} (warm: compiled code from an earlier run)"
    return f"compile cache: {folder} (cold: the first compile here takes a while)"


def start_workers() -> bool:
    """Start torch.compile's compile worker processes now; True if PyTorch can.

    PyTorch starts them at the first compile, after tracing the model; each
    imports torch first, which takes seconds. Started before the data loads and
    the model is built, they are ready by the time Triton has kernels to compile.
    A private PyTorch function: where a version lacks it, nothing changes.
    """
    try:
        from torch._inductor.async_compile import maybe_warm_pool
    except ImportError:
        return False
    maybe_warm_pool()
    return True


#: Inductor's switch for its layout optimisation (convolutions made channels-last).
LAYOUT_VARIABLE = "TORCHINDUCTOR_LAYOUT_OPTIMIZATION"


def keep_layouts(device_type: str) -> bool:
    """Turn inductor's layout optimisation off on MPS; True if this turned it off.

    Compiled training ran 4.5-9x slower than eager on MPS until
    TORCHINDUCTOR_LAYOUT_OPTIMIZATION=0 (pytorch#192551). Compiling is off on
    MPS unless asked for (--compile=true); then the layouts stay as eager
    code has them. A TORCHINDUCTOR_LAYOUT_OPTIMIZATION you set is left as it is.
    """
    if device_type != "mps" or LAYOUT_VARIABLE in os.environ:
        return False
    import torch._inductor.config as inductor_config

    inductor_config.layout_optimization = False
    return True
