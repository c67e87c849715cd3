"""The mixed-device guard: ops whose tensor arguments live on several devices.

It fails what fails on a Mac and nothing else (:func:`.device_mix.mix_kind`
judges each op):

- a CPU tensor that is not 0-dim beside device tensors (a Mac raises), or a
  0-dim one in a kernel that binds it as a Metal buffer (``lerp`` with a CPU
  ``weight``: a crash on a Mac, nanochat PR #145), is a ``mixed-devices``
  finding;
- a 0-dim CPU input elsewhere (``x * torch.tensor(2.0)``,
  ``p.mul_(1 - lr_t * wd_t)``) is legal on a Mac, which reads it as a scalar
  on the host: a ``cpu-scalar`` note, listed in the summary with its cost,
  never a failure;
- CPU index tensors (``x[cpu_idx]``, ``index_put_``), ``fill_`` with a 0-dim
  CPU value and the copies that move data between devices are not findings.

Under ``--mps-emulate`` (tags design) the emulation raises where a Mac raises
before each call runs, so the guard watches no aten op: :class:`ScalarNotes`
takes the notes from the emulation, per call.

On by default under ``--mps`` and ``--mps-emulate``; ``--mps-mixed-devices``
(or its ini twin) and the ``no_mixed_devices`` marker turn it on anywhere (CPU
vs meta tensors show it on a machine without GPU).
"""

from __future__ import annotations

import sys
from collections.abc import Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pytest

from pytest_mps import ownership
from pytest_mps.watch import device_mix, settings
from pytest_mps.watch.attribution import CODE, side_for, whose
from pytest_mps.watch.device_mix import (
    MIXED,
    SCALAR,
    describe_tensors,
    exempt_ops,
    mix_kind,
)
from pytest_mps.watch.findings import TestFindings, describe, findings_for
from pytest_mps.watch.locations import user_location

if TYPE_CHECKING:
    from pytest_mps.watch import OpCallback


class DeviceGuard:
    """The per-op callback: records ops mixing CPU and non-CPU tensors."""

    #: a call whose tensors share a side cannot mix: skip clean calls (watch.front)
    every_op = False
    #: calls on CPU tensors alone cannot mix devices
    watches_cpu = False

    def __init__(self, findings: TestFindings) -> None:
        self.exempt = frozenset(id(op) for op in exempt_ops())
        self.findings = findings

    def __call__(
        self, func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> None:
        """Record ``func`` if its tensors are on the CPU and elsewhere."""
        if id(func) in self.exempt:
            return
        kind = mix_kind(func, args, kwargs)
        if kind != MIXED and kind != SCALAR:
            return
        side, frame = whose(sys._getframe(1))
        if side_for(side, "mixed-devices") != CODE:
            return  # the test's own check (torch.testing)
        where = user_location(frame) if frame is not None else "unknown"
        self.findings.add(
            "mixed-devices" if kind == MIXED else "cpu-scalar",
            func._schema.name,
            where,
            detail=describe_tensors(args, kwargs),
        )


class ScalarNotes:
    """The guard under an emulation that judges placements per call (tags).

    The emulation raises where a Mac raises before the call runs, so the
    guard keeps only its note: each call given a 0-dim host tensor, shown by
    the emulation (:data:`.device_mix.scalar_seen`), with no per-op watch.
    """

    def __init__(self, findings: TestFindings) -> None:
        self.findings = findings

    def __call__(
        self, name: str, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> None:
        """Note the call ``name`` given a 0-dim host tensor, at the user's line."""
        side, frame = whose(sys._getframe(1))
        if side_for(side, "mixed-devices") != CODE:
            return  # the test's own check (torch.testing)
        where = user_location(frame) if frame is not None else "unknown"
        self.findings.add(
            "cpu-scalar",
            f"aten::{name}",
            where,
            detail=describe_tensors(tuple(args), kwargs),
        )


def _mode_for(item: pytest.Item) -> str:
    if ownership.closest_marker(item, "no_mixed_devices") is not None:
        return "error"
    return item.config.stash.get(settings.mixed_mode_key, "off")


def pytest_mps_watch_ops(item: pytest.Item) -> OpCallback | None:
    if _mode_for(item) == "off" or device_mix.judged[0]:
        return None
    return DeviceGuard(findings_for(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    if device_mix.judged[0] and _mode_for(item) != "off":
        device_mix.scalar_seen[0] = ScalarNotes(findings_for(item))
        try:
            result = yield
        finally:
            device_mix.scalar_seen[0] = None
    else:
        result = yield
    if _mode_for(item) != "error":
        return result
    found = findings_for(item).of_kind("mixed-devices")
    if found:
        pytest.fail(
            f"{len(found)} op(s) mixed tensors of several devices, which fails "
            "on a Mac (a CPU tensor beside MPS tensors, or a 0-dim one in a "
            "kernel that binds it as a Metal buffer):\n  "
            + "\n  ".join(describe(found, item.config.rootpath)),
            pytrace=False,
        )
    return result
