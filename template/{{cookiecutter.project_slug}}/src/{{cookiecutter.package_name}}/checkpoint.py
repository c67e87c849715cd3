"""Checkpoints: written atomically, read with a clear error when damaged.

A checkpoint is first written to a temporary file in the same folder, flushed to
disk, then renamed over the old one with os.replace, which is atomic: a run killed
mid-save leaves the previous checkpoint intact, never half a file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .errors import CheckpointError
from .files import atomic_file

PROG = "{{ cookiecutter.project_slug }}"
FORMAT = 1
REQUIRED = ("format", "model", "model_config", "tokenizer", "iter_num")


def path_in(out_dir: str | Path) -> Path:
    return Path(out_dir) / "ckpt.pt"


def save(state: dict[str, Any], path: Path) -> None:
    """Write `state` to `path` so that `path` is always a whole checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as f:
        torch.save({"format": FORMAT, **state}, f)


def load(path: Path, mmap: bool = False) -> dict[str, Any]:
    """Read a checkpoint onto the CPU, or raise CheckpointError saying what to do.

    mmap: map the file instead of reading it, to look at a large checkpoint's
    iteration and settings without loading its weights.
    """
    if not path.is_file():
        raise CheckpointError(
            f"no checkpoint at {path}: train first (`{PROG} train`) or point"
            " --out_dir at the folder of a run"
        )
    try:
        # weights_only: a checkpoint is data; never run code from one.
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # pickle, zip and torch errors all mean "damaged"
        raise CheckpointError(
            f"{path} is corrupt or not a checkpoint ({type(exc).__name__}: {exc});"
            " delete it, or train from scratch with --init_from=scratch"
        ) from exc
    if not isinstance(state, dict):
        raise CheckpointError(
            f"{path} holds a {type(state).__name__}, not a checkpoint"
        )
    missing = [key for key in REQUIRED if key not in state]
    if missing:
        raise CheckpointError(
            f"{path} is not a checkpoint of this project (no {missing})"
        )
    if state["format"] != FORMAT:
        raise CheckpointError(
            f"{path} has format {state['format']}; this version reads format {FORMAT}"
        )
    return state
