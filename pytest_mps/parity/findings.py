"""What a localization found: the first wrong op, where it ran, and the report.

Made by :mod:`.localize` (the op replay) and :mod:`.layers` (the first wrong
layer); read by the parity check, which prints :meth:`Localization.lines`,
and by users through ``ParityError.report.localization``.
"""

from __future__ import annotations

import dataclasses

from pytest_mps.parity.compare import LeafDiff
from pytest_mps.parity.layers import WrongLayer


@dataclasses.dataclass(frozen=True)
class Site:
    """Where an op ran: its module, the user's line, forward or backward."""

    module: str | None
    kind: str | None
    line: str
    phase: str


@dataclasses.dataclass(frozen=True)
class WrongOp:
    """A device op whose output leaves the tolerance on its own inputs."""

    index: int
    op: str
    site: Site
    inputs: list[str]
    diff: LeafDiff
    output: str
    device_value: float | complex
    cpu_value: float | complex


@dataclasses.dataclass
class Localization:
    """What the replay of every device op found."""

    device: str
    ops: int = 0
    replayed: int = 0
    random: int = 0
    no_cpu_kernel: dict[str, int] = dataclasses.field(default_factory=dict)
    wrong: list[WrongOp] = dataclasses.field(default_factory=list)
    wrong_count: int = 0
    #: the leaves whose rerun left the tolerance of the first device run
    rerun_differs: list[str] = dataclasses.field(default_factory=list)
    #: the innermost module call wrong with what it was given right
    layer: WrongLayer | None = None

    @property
    def first(self) -> WrongOp | None:
        """The first op out of tolerance, in the order the device ran them."""
        return self.wrong[0] if self.wrong else None

    def lines(self) -> list[str]:
        """The report: the first wrong op, its layer, inputs and worst element."""
        head = (
            f"localized: the device side ran again with the test's seed; each of its "
            f"{self.ops} aten ops was run again on the cpu from the inputs it had on "
            f"{self.device} ({self.replayed} compared"
        )
        skipped = []
        if self.random:
            skipped.append(f"{self.random} random")
        if self.no_cpu_kernel:
            n = sum(self.no_cpu_kernel.values())
            names = ", ".join(sorted(self.no_cpu_kernel)[:3])
            skipped.append(f"{n} with no cpu kernel: {names}")
        out = [head + (", " + "; ".join(skipped) if skipped else "") + ")"]
        if self.rerun_differs:
            shown = ", ".join(self.rerun_differs[:3])
            more = len(self.rerun_differs) - 3
            out.append(
                f"  the rerun on {self.device} differs from its first run (same "
                f"inputs, same seed): {shown}"
                + (f" and {more} more" if more > 0 else "")
                + "; its results depend on the run, not only on the inputs"
            )
        first = self.first
        layer = self.layer
        if first is None:
            names = ", ".join(sorted(self.no_cpu_kernel))
            unjudged = f"; or from an op not compared ({names})" if names else ""
            if layer is not None:
                out += [
                    layer.line(),
                    "  no op in it leaves its tolerance on its own inputs: it runs "
                    "other ops on the device (code that depends on the device), or "
                    "the difference builds up over its ops" + unjudged,
                ]
            else:
                out.append(
                    "  no op leaves its tolerance on its own inputs, and no layer "
                    "with what it was given within it: the difference builds up "
                    "over many ops" + unjudged
                )
            return out
        site = first.site
        where = f"layer {site.module} ({site.kind})" if site.module else "no module"
        d = first.diff
        out += [
            f"  first op out of tolerance: {first.op} (op {first.index + 1} of "
            f"{self.ops}, {site.phase}) in {where}, "
            + (
                "the backward of the call at "
                if site.phase == "backward"
                else "called at "
            )
            + site.line,
            *(f"    {text}" for text in first.inputs),
            f"    {first.output}: {d.mismatched}/{d.numel} elements out of "
            f"tolerance, worst at {_index(d.worst)}: {self.device} "
            f"{first.device_value:.6g}, cpu {first.cpu_value:.6g} (|diff| "
            f"{d.max_abs:.2e}, allowed {d.atol:.1e} + {d.rtol:.1e} x |cpu|)",
        ]
        if layer is not None and layer.module != site.module:
            out.append(layer.line())
        later = [w for w in self.wrong[1:]]
        if later:
            shown = ", ".join(
                f"{w.op} in {w.site.module or 'no module'} ({w.site.phase})"
                for w in later
            )
            more = self.wrong_count - len(self.wrong)
            out.append(
                f"  also out of tolerance on their own inputs: {shown}"
                + (f" and {more} more" if more > 0 else "")
            )
        return out


def _index(index: tuple[int, ...] | None) -> str:
    return "()" if not index else "(" + ", ".join(map(str, index)) + ")"
