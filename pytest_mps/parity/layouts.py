"""The memory layouts a parity check runs again on: same values, other strides.

Wrong results on non-contiguous inputs are MPS's most serious bug class: a
kernel that assumes contiguous memory reads the wrong elements and returns
plausible numbers (pytorch#124834 and #118115, both high priority; Conv3d in
#197114; bmm past 2**32 elements in #197636). ``layouts=True`` runs the
device side again with each input remade in these layouts and compares every
leaf with the contiguous run and with the reference.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from pytest_mps.parity.compare import MAX_ROWS, LeafDiff, table
from pytest_mps.parity.run import Plan

if TYPE_CHECKING:
    import torch

#: The MPS issues behind the check, cited in its failure message.
ISSUES = "pytorch#124834, #118115; Conv3d #197114; bmm past 2**32 elements #197636"


@dataclasses.dataclass(frozen=True)
class Layout:
    """One way to lay out an input: its name, what it does, which ranks it fits."""

    name: str
    what: str
    fits: Callable[[torch.Tensor], bool]
    remake: Callable[[torch.Tensor], torch.Tensor]
    #: the module's parameters take this memory format too (channels_last)
    memory_format: Any = None

    def apply(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` in this layout (same values) where it fits, else as it is."""
        return self.remake(tensor) if self.fits(tensor) else tensor


def _transposed(t: torch.Tensor) -> torch.Tensor:
    # the last two dims swapped in memory: strides (1, n) for an (m, n) matrix
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def _strided(t: torch.Tensor) -> torch.Tensor:
    # every other element of a buffer twice as wide; the gaps hold NaN (or 0),
    # so a kernel that reads them shows it
    import math

    fill: float | int = math.nan if t.is_floating_point() or t.is_complex() else 0
    wide = t.new_full((*t.shape[:-1], 2 * t.shape[-1]), fill)
    wide[..., ::2] = t
    return wide[..., ::2]


def _changes(t: torch.Tensor, rank: int) -> bool:
    return t.dim() == rank and t.numel() > 1


def all_layouts() -> tuple[Layout, ...]:
    """transposed, strided, channels_last (4-d), channels_last_3d (5-d)."""
    import torch

    return (
        Layout(
            "transposed",
            "each input's last two dims swapped in memory",
            lambda t: t.dim() >= 2 and t.shape[-1] > 1 and t.shape[-2] > 1,
            _transposed,
        ),
        Layout(
            "strided",
            "each input a slice of every other element",
            lambda t: t.dim() >= 1 and t.numel() > 1,
            _strided,
        ),
        Layout(
            "channels_last",
            "4-d inputs and weights in torch.channels_last",
            lambda t: _changes(t, 4),
            lambda t: t.contiguous(memory_format=torch.channels_last),
            torch.channels_last,
        ),
        Layout(
            "channels_last_3d",
            "5-d inputs and weights in torch.channels_last_3d",
            lambda t: _changes(t, 5),
            lambda t: t.contiguous(memory_format=torch.channels_last_3d),
            torch.channels_last_3d,
        ),
    )


def fitting(tensors: Iterable[torch.Tensor]) -> list[Layout]:
    """The layouts that change at least one of ``tensors``."""
    found = list(tensors)
    return [
        layout
        for layout in all_layouts()
        if any(layout.fits(t) and not layout.apply(t).is_contiguous() for t in found)
    ]


def module_format(layout: Layout, module: Any) -> Any:
    """The memory format to give ``module``'s weights, where all of them take it."""
    if layout.memory_format is None or module is None:
        return None
    rank = 4 if layout.name == "channels_last" else 5
    shaped = [p for p in module.parameters() if p.dim() in (4, 5)]
    if not shaped or any(p.dim() != rank for p in shaped):
        return None
    return layout.memory_format


def laid_out(plan: Plan, layout: Layout) -> Plan:
    return dataclasses.replace(
        plan, layout=layout.apply, memory_format=module_format(layout, plan.fn)
    )


def layouts_note(fits: list[Layout]) -> str:
    if not fits:
        return "layouts: no input has a dim to lay out otherwise: none run"
    return "layouts run again on the device: " + ", ".join(f.name for f in fits)


def layout_failure(
    layout: Layout,
    target: torch.device,
    against_run: list[LeafDiff],
    against_ref: list[LeafDiff],
    odd: list[str],
) -> list[str]:
    """The lines naming a layout that differs, or none."""
    bad_run = [d for d in against_run if not d.ok]
    bad_ref = [d for d in against_ref if not d.ok]
    if not (bad_run or bad_ref or odd):
        return []
    return [
        f"layout {layout.name} ({layout.what}) gives other results on {target}: "
        f"{len(bad_run)} of {len(against_run)} leaves differ from the contiguous "
        f"run, {len(bad_ref)} of {len(against_ref)} from the reference",
        f"  (wrong results on non-contiguous inputs are a known MPS bug class: "
        f"{ISSUES})",
        *odd,
        table((bad_run or bad_ref)[:MAX_ROWS]),
    ]
