"""A failing parity check, kept in one file: replayed later, or now in a fresh process.

With ``--mps-parity-bundle=DIR`` each failing parity check writes
``DIR/<test>.mps-bundle.pt`` (atomically): the module (its state and a
reference to its class), the inputs, the check's options, the seed, the
machine's fingerprint, and a SHA-256 digest of every leaf both sides
computed. Small: no outputs, only what it takes to run the check again.
:func:`replay_bundle` runs it again, as a test or from the command line
(``python -m pytest_mps.parity.replay PATH``), and says whether each side
gives the same bits as when the bundle was written.

With ``--mps-parity-fresh`` a failing check is also run again in a fresh
Python process from its bundle: a failure that does not come back there
depends on this process's state, such as the caching allocator's history
(pytorch#193487: transposed float32 matmuls 10-30% wrong, "the identical
tensors compute correctly in a fresh process").
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_mps import backend
from pytest_mps.parity.settings import SUFFIX, current_test, directory, fresh

if TYPE_CHECKING:
    import torch

    from pytest_mps.parity.run import Leaves, Run

FORMAT = "pytest-mps parity bundle 1"
#: how long a fresh process may take, in seconds
FRESH_TIMEOUT = 600


def digest(tensor: torch.Tensor | None) -> str | None:
    """SHA-256 of a tensor's values, its dtype and shape (None for None)."""
    if tensor is None:
        return None
    import torch

    t = tensor.detach().to("cpu").contiguous()
    h = hashlib.sha256(f"{t.dtype} {tuple(t.shape)}".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def digests(run: Run) -> dict[str, str | None]:
    """Every leaf of a run by its path."""
    leaves: Leaves = [*run.outputs, *run.grads, *run.after]
    return {path: digest(t) for path, t in leaves}


def fingerprint(device: torch.device) -> dict[str, Any]:
    """The machine, the OS, torch and the device, as far as they can be read."""
    import torch

    found: dict[str, Any] = {
        "os": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": str(device),
    }
    if device.type == "cuda" and torch.cuda.is_available():
        found["gpu"] = torch.cuda.get_device_name(device)
    if device.type == "mps":
        found["emulated"] = emulated_macos() is not None
        if found["emulated"]:
            found["emulated_macos"] = ".".join(map(str, emulated_macos() or ()))
        else:
            found["macos"] = backend.macos_version() or ""
    return found


def emulated_macos() -> tuple[int, int] | None:
    """The emulated macOS version while ``--mps-emulate`` runs, else None."""
    module = sys.modules.get("pytest_mps.emulate.policy")
    current = getattr(module, "current", [None])[0] if module else None
    return None if current is None else tuple(current.macos)


def file_name(test: str | None, where: str) -> str:
    """A file name for the test's bundle: its node id, made safe."""
    base = re.sub(r"[^A-Za-z0-9_.-]+", "_", test or where).strip("_.")[:150]
    return (base or "parity") + SUFFIX


def write(path: Path, bundle: dict[str, Any]) -> None:
    """Save ``bundle`` to ``path`` atomically: a reader sees all of it or none."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as stream:
            torch.save(bundle, stream)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 is not the user's default
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def load(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a bundle; errors name the file and what is wrong with it."""
    import torch

    where = Path(path)
    if not where.is_file():
        raise FileNotFoundError(f"{where}: no such parity bundle")
    try:
        bundle = torch.load(where, weights_only=False, map_location="cpu")
    except (ModuleNotFoundError, AttributeError) as exc:
        raise RuntimeError(
            f"{where}: the module's class cannot be imported here ({exc}); run "
            "from the directory the test ran in, or put its package on sys.path"
        ) from exc
    except Exception as exc:
        raise ValueError(f"{where}: not a parity bundle ({exc})") from exc
    if not isinstance(bundle, dict) or bundle.get("format") != FORMAT:
        raise ValueError(f"{where}: not a parity bundle (no {FORMAT!r} header)")
    return bundle


def describe(bundle: dict[str, Any]) -> str:
    """What a bundle holds, in one line."""
    options = bundle["options"]
    fn = bundle["fn"]
    what = type(fn).__name__ if not callable(fn) or hasattr(fn, "state_dict") else ""
    name = what or getattr(fn, "__qualname__", repr(fn))
    return (
        f"{name} on {options['device']} against {options['reference']}, "
        f"{len(bundle['inputs'])} inputs, seed {options['seed']}, "
        f"{len(bundle['device_digests'])} leaves digested, written by torch "
        f"{bundle['fingerprint']['torch']} on {bundle['fingerprint']['os']}"
    )


def make(
    fn_or_module: Any,
    inputs: tuple[Any, ...],
    options: dict[str, Any],
    runs: tuple[Run, Run],
    devices: tuple[torch.device, torch.device],
    where: str,
) -> dict[str, Any]:
    """The bundle of one failing check."""
    from pytest_mps.parity.run import _map

    def host(t: torch.Tensor) -> torch.Tensor:
        return t.detach().to("cpu", copy=True)

    def to_cpu(module: Any) -> Any:
        import copy

        return copy.deepcopy(module).to("cpu") if hasattr(module, "to") else module

    fn = to_cpu(fn_or_module) if hasattr(fn_or_module, "state_dict") else fn_or_module
    kwargs = options.pop("kwargs", None) or {}
    return {
        "format": FORMAT,
        "what": (
            "the module or function of a failing parity check, its inputs and "
            "options: replay with pytest_mps.replay_bundle(path) or python -m "
            "pytest_mps.parity.replay PATH"
        ),
        "test": current_test[0],
        "where": where,
        "fn": fn,
        "inputs": _map(inputs, host),
        "kwargs": _map(kwargs, host),
        "options": {
            **options,
            "device": str(devices[1]),
            "reference": str(devices[0]),
        },
        "fingerprint": fingerprint(devices[1]),
        "sys_path": [p for p in sys.path if p and os.path.isdir(p)][:20],
        "reference_digests": digests(runs[0]),
        "device_digests": digests(runs[1]),
    }


def on_failure(
    fn_or_module: Any,
    inputs: tuple[Any, ...],
    options: dict[str, Any],
    runs: tuple[Run, Run] | None,
    devices: tuple[torch.device, torch.device],
    where: str,
) -> list[str]:
    """Write the bundle (and rerun it fresh) for a failing check: report lines."""
    if runs is None:
        return []
    folder = directory[0]
    temporary = None
    if folder is None:
        temporary = tempfile.TemporaryDirectory(prefix="pytest-mps-bundle-")
        folder = Path(temporary.name)
    path = folder / file_name(current_test[0], where)
    try:
        bundle = make(fn_or_module, inputs, dict(options), runs, devices, where)
        write(path, bundle)
    except Exception as exc:  # pickling a lambda or a local class
        if temporary is not None:
            temporary.cleanup()
        first = str(exc).strip().splitlines()
        return [
            f"repro bundle not written: {type(exc).__name__}: "
            f"{first[0] if first else ''} (a module or function defined at the "
            "top level of a module can be saved; a lambda or a local class cannot)"
        ]
    lines = (
        [] if temporary is not None else [f"repro bundle: {path} ({describe(bundle)})"]
    )
    if fresh[0]:
        lines.append(fresh_verdict(path, devices[1]))
    if temporary is not None:
        temporary.cleanup()
    return lines


def fresh_verdict(path: Path, device: torch.device) -> str:
    """Run the bundle in a fresh process; say whether the failure comes back."""
    command = [sys.executable, "-m", "pytest_mps.parity.replay", str(path), "--json"]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p and os.path.isdir(p)])
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=FRESH_TIMEOUT
        )
    except subprocess.TimeoutExpired:
        return f"fresh process: no answer within {FRESH_TIMEOUT} s"
    verdict = _last_json(done.stdout)
    if verdict is None:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
        return f"fresh process: could not replay ({tail[0]})"
    if verdict["failed"]:
        return (
            f"fresh process: the failure comes back in a fresh process on "
            f"{verdict['device']} ({verdict['summary']}): it does not depend on "
            "this process's state"
        )
    return (
        f"fresh process: the check passes in a fresh process on {verdict['device']}: "
        "the failure depends on this process's state (what ran before it, the "
        "caching allocator's history, a mode or patch left active), not on the "
        "inputs alone"
    )


def _last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.strip().splitlines()):
        with contextlib.suppress(ValueError):
            found = json.loads(line)
            if isinstance(found, dict):
                return found
    return None
