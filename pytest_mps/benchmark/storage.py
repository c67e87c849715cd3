"""Benchmark files: pytest-benchmark's JSON schema, baselines, regression checks.

Runs are saved as ``<storage>/<machine key>/NNNN_<name>.json``, the layout
``pytest-benchmark compare`` reads. The machine key tells Apple chips (and
their GPU core counts), CUDA GPUs and CPUs apart, so two machines' baselines
never collide. Every file is written atomically.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pytest_mps import backend
from pytest_mps.machine.fingerprint import cpu_name

RUN_FILE = re.compile(r"^(\d{4})_(.*)\.json$")


# -- machine and commit -----------------------------------------------------------


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
        # the real host's, under --mps-emulate too (emulate/host.py)
        "processor": platform.uname().processor,
        "machine": platform.uname().machine,
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
    benchmarks: list[dict[str, Any]],
    root: Path,
    version: str,
    fingerprint: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A whole pytest-benchmark JSON document for these benchmark entries.

    ``fingerprint``: the machine's (:mod:`pytest_mps.machine.fingerprint`),
    kept in ``machine_info["fingerprint"]`` for comparisons to read.
    """
    info = machine_info(benchmarks)
    if fingerprint is not None:
        info["fingerprint"] = dict(fingerprint)
    return {
        "machine_info": info,
        "commit_info": commit_info(root),
        "benchmarks": benchmarks,
        "datetime": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "version": version,
    }


# -- files ------------------------------------------------------------------------


def _temporary(path: Path, data: Mapping[str, Any]) -> Path:
    """``data`` as JSON in a flushed temporary file beside ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=4, ensure_ascii=True, default=str)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as open() would; mkstemp's 0600 is for secrets
    except BaseException:
        _unlink(Path(tmp))
        raise
    return Path(tmp)


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def write_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` as JSON to ``path`` so that no reader sees half a file.

    The text goes to a temporary file beside ``path``, is flushed to disk and
    renamed over it: after Ctrl-C there is the old file or the new one.
    """
    tmp = _temporary(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise


def _create_new(tmp: Path, path: Path) -> bool:
    """Give the whole file ``tmp`` the name ``path`` unless that name exists.

    A hard link is atomic and never replaces (FileExistsError); where the file
    system has no hard links, the name is reserved with O_EXCL and then
    replaced by the whole file.
    """
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    except OSError:
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        os.replace(tmp, path)
        return True
    _unlink(tmp)
    return True


def saved_runs(folder: Path) -> list[Path]:
    """The ``NNNN_name.json`` files in ``folder``, oldest first."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if RUN_FILE.match(p.name))


@contextlib.contextmanager
def _folder_lock(folder: Path) -> Iterator[None]:
    """Hold the folder's lock while a run number is chosen and taken."""
    from filelock import FileLock

    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(folder / ".pytest-mps-save.lock", timeout=60):
        yield


def _number(path: Path) -> int:
    match = RUN_FILE.match(path.name)
    return int(match.group(1)) if match else 0


def save_run(storage: Path, doc: Mapping[str, Any], name: str) -> Path:
    """Save ``doc`` as the next ``NNNN_name.json`` of this machine's folder.

    Never replaces a file: the number is chosen under the folder's lock, so
    two sessions saving at once get two numbers, and the file is put in place
    only under a name nobody has (a tool that ignores the lock cannot be
    overwritten either).
    """
    folder = storage / str(doc["machine_info"]["machine_key"])
    stem = _slug(name) or "run"
    with _folder_lock(folder):
        runs = saved_runs(folder)
        number = max((_number(p) for p in runs), default=0) + 1
        tmp = _temporary(folder / f"{number:04d}_{stem}.json", doc)
        try:
            while True:
                path = folder / f"{number:04d}_{stem}.json"
                taken = any(p.name.startswith(f"{number:04d}_") for p in runs)
                if not taken and _create_new(tmp, path):
                    return path
                number += 1
                runs = saved_runs(folder)
        finally:
            _unlink(tmp)


def without_rounds(doc: Mapping[str, Any]) -> dict[str, Any]:
    """``doc`` without each benchmark's per-round times (``stats.data``)."""
    benchmarks = []
    for bench in doc["benchmarks"]:
        stats = {k: v for k, v in bench["stats"].items() if k != "data"}
        benchmarks.append({**bench, "stats": stats})
    return {**doc, "benchmarks": benchmarks}


def autosave_name(commit: Mapping[str, Any]) -> str:
    """pytest-benchmark's autosave name: commit, time, and whether it was dirty."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d_%H%M%S")
    name = f"{str(commit.get('id', 'unversioned'))[:12]}_{stamp}"
    return name + ("_uncommitted-changes" if commit.get("dirty") else "")
