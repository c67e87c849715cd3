"""The probe: one small op on the device at the session's start, timed.

A paravirtual GPU's first allocation can fail ("MPS backend out of memory
(MPS allocated: 0 bytes", pytorch#111576) and a hung device never answers;
both show before any test. On a real device the op runs in a process of its
own (:func:`_in_child`), stopped at the limit: a probe left running in the
pytest process would keep using MPS beside the tests, and concurrent use of
MPS from two threads can crash (pytorch#197805). The child's import of torch
has a limit of its own (:data:`IMPORT_LIMIT`), so a slow import is not read as a
slow device. Under ``--mps-emulate`` the device is the CPU: the op runs on a
daemon thread here, where the emulation is installed.

A probe that did not finish is :attr:`Probed.slow`: on a Mac with other signs
of a virtual GPU it is one more, on a physical Mac it is reported as slow and
not as virtual (a first Metal use compiles its shaders).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import NamedTuple

#: Seconds the probe's child may take to import torch before its op starts.
IMPORT_LIMIT = 120.0

_CODE = """
import sys
import torch
from pytest_mps import accelerator
print("imported", flush=True)
try:
    device = torch.device(sys.argv[1])
    value = torch.ones(4, device=device) * 2
    accelerator.synchronize(device)
    total = float(value.sum().item())
    if total != 8.0:
        raise RuntimeError(f"4 ones times 2 summed to {total}")
    print("done", flush=True)
except Exception as exc:
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    print(f"error {type(exc).__name__}: {first}", flush=True)
"""


class Probed(NamedTuple):
    """What the probe found wrong: the op failed, or did not finish in time."""

    slow: bool
    text: str


def probe(device: str, timeout: float, in_child: bool = True) -> Probed | None:
    """None when one small op on ``device`` finishes within ``timeout`` seconds.

    ``in_child``: in a process of its own (stopped at the limit), else on a
    daemon thread here. Where the process holds its parent's answers (the
    isolation's fork server, which must not touch Metal), the parent's result.
    """
    from pytest_mps import backend

    if backend.holding[0]:
        held = backend.answers.get("probe")
        return None if held is None else Probed(*held)
    found = (_in_child if in_child else _in_thread)(device, timeout)
    backend.answers["probe"] = None if found is None else list(found)
    return found


def _slow(device: str, timeout: float) -> Probed:
    return Probed(
        True, f"a 4-element op on {device} did not finish within {timeout:g} s"
    )


def _failed(device: str, error: str) -> Probed:
    return Probed(False, f"a 4-element op on {device} failed: {error}")


def _in_child(device: str, timeout: float) -> Probed | None:
    child = subprocess.Popen(
        [sys.executable, "-c", _CODE, device],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    lines: list[str] = []
    arrived = threading.Condition()

    def read() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            with arrived:
                lines.append(line.strip())
                arrived.notify()
        with arrived:
            lines.append("")  # the child's end
            arrived.notify()

    threading.Thread(target=read, name="pytest-mps probe", daemon=True).start()

    def line(number: int, limit: float) -> str | None:
        deadline = time.monotonic() + limit
        with arrived:
            while len(lines) <= number:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                arrived.wait(left)
            return lines[number]

    try:
        if line(0, IMPORT_LIMIT) != "imported":
            return None  # torch would not import there: no word on the device
        answer = line(1, timeout)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
    if answer is None:
        return _slow(device, timeout)
    if answer.startswith("error "):
        return _failed(device, answer.removeprefix("error "))
    return None if answer == "done" else _failed(device, f"the probe ended: {answer!r}")


def _in_thread(device: str, timeout: float) -> Probed | None:
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            import torch

            from pytest_mps import accelerator

            target = torch.device(device)
            value = torch.ones(4, device=target) * 2
            accelerator.synchronize(target)
            if float(value.sum().item()) != 8.0:
                raise RuntimeError(f"4 ones times 2 summed to {value.sum().item()}")
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - reported, not raised
            outcome.append(exc)

    worker = threading.Thread(target=run, name="pytest-mps probe", daemon=True)
    worker.start()
    worker.join(timeout)
    if not outcome:
        return _slow(device, timeout)
    error = outcome[0]
    if error is None:
        return None
    first = (str(error).strip().splitlines() or [""])[0][:200]
    return _failed(device, f"{type(error).__name__}: {first}")
