"""Finding and reading the baseline a run is compared with.

``--mps-benchmark-compare [RUN]`` names a saved run of this machine (its
number, part of its name, the latest) or a file; every problem is a
:class:`BaselineError` whose message says what is missing and what to do.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pytest_mps.benchmark.storage import RUN_FILE, saved_runs


class BaselineError(Exception):
    """A baseline that cannot be used; the message says why and what to do."""


def _describe(path: Path, storage: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def find_baseline(storage: Path, key: str, wanted: str | None) -> Path:
    """The file ``--mps-benchmark-compare [wanted]`` means, or BaselineError.

    ``wanted`` is None (the latest run of this machine), a run number
    (``0003``), part of a run's name, or a path to a file.
    """
    if wanted:
        candidate = Path(wanted)
        if candidate.suffix == ".json" or os.sep in wanted:
            if candidate.is_file():
                return candidate
            raise BaselineError(f"baseline file {wanted} does not exist")
    folder = storage / key
    runs = saved_runs(folder)
    if not runs:
        others = sorted(
            f"{p.name} ({len(saved_runs(p))} runs)"
            for p in (storage.iterdir() if storage.is_dir() else [])
            if saved_runs(p)
        )
        message = (
            f"no baseline for this machine: {_describe(folder, storage)} holds no "
            "saved run; save one with --mps-benchmark-save NAME or "
            "--mps-benchmark-autosave"
        )
        if others:
            message += (
                f". Saved runs of other machines: {', '.join(others)}; their "
                "timings are not comparable with this machine's (pass a file "
                "path to --mps-benchmark-compare to compare anyway)"
            )
        raise BaselineError(message)
    if not wanted:
        return runs[-1]
    matches = [p for p in runs if _matches(p, wanted)]
    if not matches:
        names = ", ".join(p.name for p in runs)
        raise BaselineError(
            f"no saved run matches {wanted!r} in {_describe(folder, storage)} "
            f"(saved: {names})"
        )
    return matches[-1]


def check_any_baseline(storage: Path, wanted: str | None) -> None:
    """BaselineError unless some machine's folder could hold the baseline.

    What can be checked before the benchmarks run (their machine key names
    the GPUs they ran on): a file path exists; some run is saved; a run
    matching ``wanted`` is saved.
    """
    if wanted and (Path(wanted).suffix == ".json" or os.sep in wanted):
        if not Path(wanted).is_file():
            raise BaselineError(f"baseline file {wanted} does not exist")
        return
    folders = [p for p in storage.iterdir() if p.is_dir()] if storage.is_dir() else []
    runs = [run for folder in folders for run in saved_runs(folder)]
    if not runs:
        raise BaselineError(
            f"{_describe(storage, storage)} holds no saved run; save one first "
            "with --mps-benchmark-save NAME or --mps-benchmark-autosave"
        )
    if wanted and not any(_matches(run, wanted) for run in runs):
        raise BaselineError(
            f"no saved run matches {wanted!r} in {_describe(storage, storage)}"
        )


def _matches(path: Path, wanted: str) -> bool:
    match = RUN_FILE.match(path.name)
    return path.name.startswith(wanted) or (
        match is not None and wanted in match.group(2)
    )


def load_baseline(path: Path, key: str) -> tuple[dict[str, Any], str | None]:
    """Read a baseline; the document and a warning when it is another machine's."""
    where = _describe(path, path.parent)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        # json's messages end in "at": "Unterminated string starting at"
        reason = exc.msg.removesuffix(" at")
        raise BaselineError(
            f"baseline {where} is corrupt (not JSON: {reason}, line {exc.lineno} "
            f"column {exc.colno}); delete it or save a new run"
        ) from None
    except UnicodeDecodeError as exc:
        raise BaselineError(
            f"baseline {where} is not UTF-8 text (byte {exc.start}: "
            f"{exc.object[exc.start : exc.start + 1]!r}): it is not a benchmark "
            "file pytest-mps saved; pass another file, or delete it and save a "
            "new run with --mps-benchmark-save NAME"
        ) from None
    except OSError as exc:
        raise BaselineError(
            f"baseline {where} cannot be read ({exc.strerror or exc}); check its "
            "permissions, or save a new run"
        ) from None
    benches = doc.get("benchmarks") if isinstance(doc, dict) else None
    if not isinstance(benches, list) or not all(
        isinstance(b, dict) and isinstance(b.get("stats"), dict) and "fullname" in b
        for b in benches
    ):
        raise BaselineError(
            f"baseline {where} is not a benchmark file (no 'benchmarks' list "
            "with 'fullname' and 'stats'); delete it or save a new run"
        )
    other = (doc.get("machine_info") or {}).get("machine_key")
    warning = None
    if other != key:
        warning = (
            f"baseline {where} was recorded on another machine ({other or 'unknown'}"
            f"; this one is {key}): the comparison mixes hardware"
        )
    return doc, warning


def machine_differences(
    doc: dict[str, Any], base_doc: dict[str, Any], path: Path
) -> str | None:
    """What differs between the two runs' machine fingerprints, or None.

    One line naming each field that differs (``os_build 24F74 -> 25A354``),
    or saying that the baseline has no fingerprint to compare.
    """
    from pytest_mps.machine.fingerprint import differences

    where = _describe(path, path.parent)
    mine = (doc.get("machine_info") or {}).get("fingerprint")
    theirs = (base_doc.get("machine_info") or {}).get("fingerprint")
    if mine is None:
        return None
    if not isinstance(theirs, dict):
        return (
            f"baseline {where} has no machine fingerprint (saved before "
            "pytest-mps recorded one): whether the OS build, chip or torch "
            "changed cannot be told; save a new baseline"
        )
    found = differences(mine, theirs)
    if not found:
        return None
    return f"baseline {where} ran on another machine setup ({'; '.join(found)})"
