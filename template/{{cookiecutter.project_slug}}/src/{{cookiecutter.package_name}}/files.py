"""Writing the user's files: folders checked up front, files replaced atomically."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from .errors import ConfigError


def ensure_writable(folder: str, setting: str) -> Path:
    """Create `folder` if needed and prove a file can be written in it.

    Called before any slow work, so a bad --out_dir or --data_dir fails at once
    with one line instead of after the first evaluation or tokenization.
    """
    path = Path(folder)
    try:
        path.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(prefix=".write-test-", dir=path)
        os.close(handle)
        os.unlink(probe)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(
            f"--{setting}={folder}: cannot write there ({reason}); pass"
            f" --{setting}=FOLDER naming a folder you can write to"
        ) from None
    return path


@contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A file to write that replaces `path` whole when the block ends.

    Readers see the old file or the new one, never half of it; if the block
    fails, `path` is left as it was.
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data` all at once: readers see the old or the new file."""
    with atomic_file(path) as f:
        f.write(data)
