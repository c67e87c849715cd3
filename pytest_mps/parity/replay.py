"""Replaying a parity bundle: as a test, from Python, or in a fresh process.

:func:`replay_bundle` runs the bundle's check again, on its device or
another, and compares each side's leaves bit for bit with the digests the
bundle holds. ``pytest DIR/x.mps-bundle.pt`` collects a bundle as a test
(only files with that suffix, which only ``--mps-parity-bundle`` writes);
``python -m pytest_mps.parity.replay PATH [--device D] [--json]`` prints the
verdict, and is what ``--mps-parity-fresh`` runs in a fresh process.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_mps.parity.bundle import digests, emulated_macos, load
from pytest_mps.parity.check import ParityError, ParityReport, _check


@dataclasses.dataclass
class Replay:
    """What a replay found."""

    path: str
    device: str
    #: the check's failure message, or None when it passed
    failure: str | None
    #: per side ("reference", "device"): (leaves with the bundle's bits, leaves)
    same_bits: dict[str, tuple[int, int]]
    report: ParityReport | None

    @property
    def failed(self) -> bool:
        """True when the check failed again."""
        return self.failure is not None

    def summary(self) -> str:
        """One line: the outcome and the bits of each side."""
        bits = "; ".join(
            f"{side} {same}/{total} leaves bit-identical to the bundle"
            for side, (same, total) in self.same_bits.items()
        )
        head = self.failure.splitlines()[0] if self.failure else "the check passes"
        return f"{head} ({bits})" if bits else head


@contextlib.contextmanager
def _device_for(bundle: dict[str, Any], device: str) -> Iterator[None]:
    """The emulated device, outside pytest, for a bundle an emulated run wrote."""
    import torch

    wanted = device.split(":")[0] == "mps"
    if not wanted or torch.backends.mps.is_available() or emulated_macos():
        yield
        return
    from pytest_mps.emulate.install import Emulation

    text = str(bundle["fingerprint"].get("emulated_macos") or "26.0")
    major, _, minor = text.partition(".")
    emulation = Emulation((int(major), int(minor or 0)), fallback=False)
    emulation.install()
    try:
        yield
    finally:
        emulation.undo()


def replay_bundle(path: str | Path, device: str | None = None) -> Replay:
    """Run a bundle's parity check again; compare each side with its digests.

    ``device`` defaults to the bundle's. The CPU reference of a bundle
    replays bit-identically on the CPU of the same torch build; a device
    whose kernels answer differently from run to run, or depend on the
    process, does not.
    """
    bundle = load(path)
    options = dict(bundle["options"])
    target = device or options.pop("device")
    options.pop("device", None)
    reference = options.pop("reference")
    failure = None
    report: ParityReport | None = None
    # the names the leaves had when the bundle was written: the digests' keys
    names = options.pop("names", None) or ["fn"] + [
        f"inputs[{i}]" for i in range(len(bundle["inputs"]))
    ]
    with _device_for(bundle, target), contextlib.redirect_stdout(io.StringIO()):
        try:
            report = _check(
                "assert_device_parity",
                bundle["fn"],
                tuple(bundle["inputs"]),
                names,
                device=target,
                reference=reference,
                kwargs=bundle["kwargs"],
                **options,
            )
        except ParityError as error:
            failure, report = str(error), error.report
    same: dict[str, tuple[int, int]] = {}
    runs = report.runs if report is not None else None
    if runs is not None:
        sides = [("reference", runs[0], bundle["reference_digests"])]
        if target == bundle["options"]["device"]:
            sides.append(("device", runs[1], bundle["device_digests"]))
        for side, run, kept in sides:
            now = digests(run)
            same[side] = (sum(now.get(p) == d for p, d in kept.items()), len(kept))
    return Replay(str(path), str(target), failure, same, report)


class BundleFile(pytest.File):
    """A parity bundle, collected as one test that replays it."""

    def collect(self) -> list[pytest.Item]:
        """The one replay test."""
        return [BundleItem.from_parent(self, name="replay")]


class BundleItem(pytest.Item):
    """Replays a bundle's parity check; fails as the original did, if it does."""

    def runtest(self) -> None:
        """Replay on the bundle's device; print how many leaves kept their bits."""
        replay = replay_bundle(self.path)
        print(f"{self.path.name}: {replay.summary()}")
        if replay.failure is not None:
            raise ReplayFailed(replay.failure)

    def repr_failure(self, excinfo: Any, style: Any = None) -> str:  # noqa: D102
        if isinstance(excinfo.value, ReplayFailed):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo, style))

    def reportinfo(self) -> tuple[Path, int | None, str]:  # noqa: D102
        return self.path, None, f"replay of {self.path.name}"


class ReplayFailed(AssertionError):
    """The bundle's check failed again."""


def main(argv: list[str] | None = None) -> int:
    """``python -m pytest_mps.parity.replay PATH``: 0 passes, 1 fails, 2 error."""
    parser = argparse.ArgumentParser(
        prog="python -m pytest_mps.parity.replay",
        description="Run a pytest-mps parity bundle's check again.",
    )
    parser.add_argument("path", help="a .mps-bundle.pt file")
    parser.add_argument("--device", default=None, help="default: the bundle's")
    parser.add_argument("--json", action="store_true", help="one JSON line")
    args = parser.parse_args(argv)
    try:
        replay = replay_bundle(args.path, args.device)
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"{args.path}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(
            json.dumps(
                {
                    "failed": replay.failed,
                    "device": replay.device,
                    "summary": replay.summary(),
                    "same_bits": replay.same_bits,
                }
            )
        )
    else:
        print(replay.summary())
        if replay.failure:
            print(replay.failure)
    return 1 if replay.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
