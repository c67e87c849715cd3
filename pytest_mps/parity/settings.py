"""What the parity options chose for this session: set by :mod:`.plugin`.

Light on purpose: the plugin imports it at start-up; :mod:`.bundle`, which
writes and reruns bundles, is imported only when a check fails.
"""

from __future__ import annotations

from pathlib import Path

#: the file name's end of a bundle (``pytest`` collects such files as tests)
SUFFIX = ".mps-bundle.pt"
#: where failing checks write bundles, or None
directory: list[Path | None] = [None]
#: whether a failing check runs again in a fresh process
fresh: list[bool] = [False]
#: the test running now: its node id
current_test: list[str | None] = [None]


def wanted() -> bool:
    """True when a failing check should write a bundle or rerun fresh."""
    return directory[0] is not None or fresh[0]
