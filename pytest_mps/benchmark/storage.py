"""Benchmark files: pytest-benchmark's JSON schema, baselines, regression checks.

Runs are saved as ``<storage>/<machine key>/NNNN_<name>.json``, the layout
``pytest-benchmark compare`` reads. The machine key tells Apple chips (and
their GPU core counts), CUDA GPUs and CPUs apart, so two machines' baselines
never collide. Every file is written atomically.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pytest_mps import backend
from pytest_mps.benchmark.options import FailExpr, parse_fail_expr

_RUN_FILE = re.compile(r"^(\d{4})_(.*)\.json$")


class BaselineError(Exception):
    """A baseline that cannot be used; the message says why and what to do."""


# -- machine and commit -----------------------------------------------------------


def cpu_name() -> str:
    """The CPU's brand string (``AMD EPYC 9454``, ``Apple M3 Max``)."""
    chip = backend.chip_name()
    if chip:
        return chip
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", text).strip("_")[:60]


def machine_info(benchmarks: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """pytest-benchmark's ``machine_info``, plus what tells GPUs apart.

    The accelerators are read from the benchmarks themselves (each records its
    device's hardware), so the controller of an xdist run needs no torch.
    """
    try:
        torch_version: str | None = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = None
    gpus: dict[str, dict[str, Any]] = {}
    for bench in benchmarks:
        extra = bench.get("extra_info", {})
        if extra.get("device", "cpu") != "cpu" and extra.get("hardware"):
            gpus.setdefault(
                extra["hardware"],
                {"name": extra["hardware"], "capability": extra.get("capability")},
            )
    chip = backend.chip_name()
    info: dict[str, Any] = {
        "node": platform.node(),
        "processor": platform.processor(),
        "machine": platform.machine(),
        "python_compiler": platform.python_compiler(),
        "python_implementation": platform.python_implementation(),
        "python_implementation_version": platform.python_version(),
        "python_version": platform.python_version(),
        "python_build": list(platform.python_build()),
        "release": platform.release(),
        "system": platform.system(),
        "cpu": {"brand_raw": cpu_name(), "count": os.cpu_count()},
        "torch": torch_version,
        "macos": backend.macos_version(),
        "apple_chip": chip if backend.macos_version() else None,
        "gpu_cores": backend.gpu_core_count(),
        "gpus": sorted(gpus.values(), key=lambda g: str(g["name"])),
    }
    info["machine_key"] = machine_key(info)
    return info


def machine_key(info: Mapping[str, Any]) -> str:
    """A folder name per machine: ``Darwin-CPython-3.12-64bit-Apple_M3_Max-40gpu``.

    The CPU's brand, the Apple GPU core count, and every CUDA GPU benchmarked
    are part of it (``...-NVIDIA_H100_80GB_HBM3``).
    """
    parts = [
        str(info["system"]),
        str(info["python_implementation"]),
        ".".join(str(info["python_version"]).split(".")[:2]),
        platform.architecture()[0],
        _slug(str(info["cpu"]["brand_raw"])),
    ]
    if info.get("gpu_cores"):
        parts.append(f"{info['gpu_cores']}gpu")
    parts.extend(_slug(str(g["name"])) for g in info.get("gpus", []))
    return "-".join(p for p in parts if p)


def _git(args: list[str], cwd: Path) -> str:
    out = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10
    )
    if out.returncode:
        raise OSError(out.stderr.strip())
    return out.stdout.strip()


def commit_info(root: Path) -> dict[str, Any]:
    """pytest-benchmark's ``commit_info`` for the git checkout at ``root``."""
    info: dict[str, Any] = {
        "id": "unversioned",
        "time": None,
        "author_time": None,
        "dirty": False,
        "project": root.name,
        "branch": "(unknown)",
    }
    try:
        info["id"] = _git(["rev-parse", "HEAD"], root)
        info["time"] = _git(["show", "-s", "--pretty=format:%cI"], root)
        info["author_time"] = _git(["show", "-s", "--pretty=format:%aI"], root)
        info["dirty"] = bool(_git(["status", "--porcelain", "-uno"], root))
        branch = _git(["rev-parse", "--abbrev-ref", "HEAD"], root)
        info["branch"] = "(detached head)" if branch == "HEAD" else branch
        top = _git(["rev-parse", "--show-toplevel"], root)
        info["project"] = Path(top).name
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def document(
    benchmarks: list[dict[str, Any]], root: Path, version: str
) -> dict[str, Any]:
    """A whole pytest-benchmark JSON document for these benchmark entries."""
    return {
        "machine_info": machine_info(benchmarks),
        "commit_info": commit_info(root),
        "benchmarks": benchmarks,
        "datetime": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "version": version,
    }


# -- files ------------------------------------------------------------------------


def write_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` as JSON to ``path`` so that no reader sees half a file.

    The text goes to a temporary file beside ``path``, is flushed to disk and
    renamed over it: after Ctrl-C there is the old file or the new one.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=4, ensure_ascii=True, default=str)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def saved_runs(folder: Path) -> list[Path]:
    """The ``NNNN_name.json`` files in ``folder``, oldest first."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if _RUN_FILE.match(p.name))


def save_run(storage: Path, doc: Mapping[str, Any], name: str) -> Path:
    """Save ``doc`` as the next ``NNNN_name.json`` of this machine's folder."""
    folder = storage / str(doc["machine_info"]["machine_key"])
    runs = saved_runs(folder)
    number = int(_RUN_FILE.match(runs[-1].name).group(1)) + 1 if runs else 1  # type: ignore[union-attr]
    path = folder / f"{number:04d}_{_slug(name) or 'run'}.json"
    while path.exists():
        number += 1
        path = folder / f"{number:04d}_{_slug(name) or 'run'}.json"
    write_atomic(path, doc)
    return path


def autosave_name(commit: Mapping[str, Any]) -> str:
    """pytest-benchmark's autosave name: commit, time, and whether it was dirty."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d_%H%M%S")
    name = f"{str(commit.get('id', 'unversioned'))[:12]}_{stamp}"
    return name + ("_uncommitted-changes" if commit.get("dirty") else "")


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
    matches = [
        p
        for p in runs
        if p.name.startswith(wanted) or wanted in _RUN_FILE.match(p.name).group(2)  # type: ignore[union-attr]
    ]
    if not matches:
        names = ", ".join(p.name for p in runs)
        raise BaselineError(
            f"no saved run matches {wanted!r} in {_describe(folder, storage)} "
            f"(saved: {names})"
        )
    return matches[-1]


def load_baseline(path: Path, key: str) -> tuple[dict[str, Any], str | None]:
    """Read a baseline; the document and a warning when it is another machine's."""
    where = _describe(path, path.parent)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise BaselineError(
            f"baseline {where} is corrupt (not JSON: {exc.msg} at line "
            f"{exc.lineno} column {exc.colno}); delete it or save a new run"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BaselineError(f"baseline {where} cannot be read: {exc}") from None
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


# -- regressions ------------------------------------------------------------------


def regressions(
    current: Iterable[Mapping[str, Any]],
    baseline: Mapping[str, Any],
    default: list[FailExpr],
) -> tuple[list[str], dict[str, float]]:
    """Slowdowns past each benchmark's thresholds, and median changes by fullname.

    A benchmark's own ``compare_fail`` (marker) replaces the session's.
    """
    base = {b["fullname"]: b["stats"] for b in baseline["benchmarks"]}
    failures: list[str] = []
    changes: dict[str, float] = {}
    for bench in current:
        old = base.get(bench["fullname"])
        if old is None:
            continue
        stats = bench["stats"]
        if old.get("median"):
            changes[bench["fullname"]] = stats["median"] / old["median"] - 1
        own = bench.get("options", {}).get("compare_fail")
        exprs = [parse_fail_expr(t, "marker") for t in own] if own else default
        for expr in exprs:
            if expr.stat in old and expr.stat in stats:
                found = expr.regression(stats[expr.stat], old[expr.stat])
                if found:
                    failures.append(f"{bench['fullname']}: {found}")
    return failures, changes
