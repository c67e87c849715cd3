"""Emptying the MPS cache between tests, with the reference cycles that hold it.

``torch.mps.empty_cache()`` returns the allocator's unused blocks to Metal,
but a device tensor that a test left in a reference cycle (a mock holding
the model that holds it, an exception's traceback kept on an object) is not
unused until Python's cycle collector runs, and that runs when allocations
say, not between tests. TabPFN's suite on 7 GB runners freed nothing by
emptying the cache alone, and a ``gc.collect()`` after every test cost 0.19 s
a test, 7 minutes of a 27-minute job, until ``gc.freeze()`` after collection
(PriorLabs/TabPFN#1093, #1279).

So, after a test, only where the device holds more than it did before the
test's setup: one ``gc.collect()``, then the cache is emptied. The objects
alive at the end of collection (modules, the collected tests, what the
conftests made) are frozen once (``gc.freeze()``, unfrozen at the session's
end), so each collection walks only what the tests made since. What the
collections freed is counted (bytes and tests) for the summary.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

import pytest


@dataclass
class Emptier:
    """The session's cache emptying: its counts, and whether the heap is frozen."""

    reason: str
    emptied: int = 0
    collected: int = 0  # tests after which a collection freed device memory
    freed: int = 0  # bytes of device tensors those collections freed
    frozen: bool = False

    def freeze(self) -> None:
        """Freeze what collection left alive, once (its cycles are not the tests')."""
        if not self.frozen:
            gc.collect()
            gc.freeze()
            self.frozen = True

    def unfreeze(self) -> None:
        """Give the frozen objects back to the collector."""
        if self.frozen:
            gc.unfreeze()
            self.frozen = False

    def before(self) -> int | None:
        """The device's allocated bytes before a test's setup."""
        return _allocated()

    def after(self, before: int | None) -> None:
        """After a test's teardown: collect where it left memory, empty the cache."""
        import torch

        from pytest_mps import accelerator
        from pytest_mps.watch.attribution import plugin_work

        with plugin_work():
            now = _allocated()
            if before is not None and now is not None and now > before:
                gc.collect()
                left = _allocated()
                if left is not None and left < now:
                    self.collected += 1
                    self.freed += now - left
            accelerator.empty_cache(torch.device("mps"))
        self.emptied += 1

    def summary(self) -> str:
        """The terminal summary's line."""
        from pytest_mps.machine.fingerprint import format_size

        line = (
            f"pytest-mps machine: emptied the MPS cache after each of {self.emptied} "
            f"tests ({self.reason})"
        )
        if self.collected:
            line += (
                f"; {self.collected} left device tensors in reference cycles, and "
                f"a garbage collection after each freed {format_size(self.freed)}"
            )
        return line


def _allocated() -> int | None:
    from pytest_mps import backend

    try:
        return int(backend.memory_stats()["allocated"])
    except (RuntimeError, KeyError, TypeError):
        return None


emptier_key = pytest.StashKey[Emptier]()
before_key = pytest.StashKey["int | None"]()
