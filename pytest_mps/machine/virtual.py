"""Virtual GPUs recognised, and the MPS cache kept small where memory is.

Hosted macOS arm64 runners report MPS as available, but their GPU is
paravirtual: PyTorch sees a Metal device named "Apple Paravirtual device"
(pytorch#111576), its limit is near 1 GiB ("max allowed: 1.70 GB",
opensoundscape#850; 1024.00 MB, runner-images#11899) or 8 GB (7.93 GB,
runner-images#9918), and it runs out of memory or hangs at random. The signs
read here: the fingerprint's (the GPU's name, the model, the chip's name, the
hypervisor flag), a Metal working set under 4 GiB (no Apple-silicon Mac has
less than 8 GB of memory, so none has under 5 GiB of working set), and a
timed probe: one small op on the device that fails or does not finish in
time.

What the run does on one is ``--mps-virtual-gpu``: ``run`` (the default;
the header names the device), ``skip`` (MPS tests skip with the signs as
the reason), ``emulate`` (the run takes ``--mps-emulate``; this acts on the
fingerprint's signs, read before anything imports torch, not on the probe).
``--mps-empty-cache`` empties the MPS allocator's cache after each test:
``auto`` where the working set is under 8 GiB or the GPU virtual (as
TransformerLens does by hand to fit its MPS job into 1 GB, #1264), ``always``,
``never``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import pytest

if TYPE_CHECKING:
    from pytest_mps.machine.fingerprint import Fingerprint

T = TypeVar("T")

POLICIES = ("run", "skip", "emulate")
EMPTY_CACHE = ("auto", "always", "never")
#: A Metal working set under this is no physical Apple-silicon Mac's.
TINY_WORKING_SET = 4 << 30
#: Under this working set, ``--mps-empty-cache=auto`` empties after each test.
SMALL_WORKING_SET = 8 << 30
#: Seconds the probe's op may take (a healthy device takes milliseconds).
PROBE_TIMEOUT = 10.0

VIRTUAL_HELP = (
    "what to do when the MPS device is a virtual GPU (hosted macOS runners: "
    "'Apple Paravirtual device', a working set under 4 GiB, a probe op that "
    "fails or hangs): run (default; the header names it), skip (MPS tests "
    "skip, naming the signs) or emulate (run as with --mps-emulate)."
)
PROBE_HELP = (
    "seconds one small op on the MPS device may take at the session's start "
    "before the device reads as hung (default 10; 0: no probe)."
)
EMPTY_CACHE_HELP = (
    "empty the MPS allocator's cache after each test: auto (default: where the "
    "Metal working set is under 8 GiB or the GPU is virtual), always, never."
)


def _choice(allowed: tuple[str, ...]) -> Callable[[str, str], str]:
    def parse(value: str, where: str) -> str:
        if value.strip() not in allowed:
            raise ValueError(f"{where}: {value!r} is not one of: {', '.join(allowed)}")
        return value.strip()

    return parse


parse_policy = _choice(POLICIES)
parse_empty_cache = _choice(EMPTY_CACHE)


def parse_timeout(value: str, where: str) -> float:
    """Seconds >= 0; ValueError naming ``where`` otherwise."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"{where}: {value!r} is not a number of seconds >= 0")
    return seconds


def setting(
    config: pytest.Config, name: str, parse: Callable[[str, str], T], default: T
) -> T:
    """The option ``name``, else its ini twin, or ``default`` (see read_setting)."""
    from pytest_mps.options import read_setting

    found = read_setting(config, name, parse, default)
    return default if found is None else found


def policy(config: pytest.Config) -> str:
    """``run``, ``skip`` or ``emulate``."""
    return setting(config, "mps_virtual_gpu", parse_policy, "run")


def emulates(config: pytest.Config) -> bool:
    """True when ``--mps-virtual-gpu=emulate`` and this Mac's GPU reads as virtual.

    Read from the fingerprint's signs only (no torch): the emulation is
    installed before the user's conftest files import anything.
    """
    if policy(config) != "emulate":
        return False
    from pytest_mps import backend
    from pytest_mps.machine.fingerprint import virtual_signs

    facts = backend.mac_facts()
    return facts is not None and bool(virtual_signs(facts))


def signs(found: Fingerprint) -> list[str]:
    """The fingerprint's signs of a virtual GPU, and a tiny working set."""
    from pytest_mps.machine.fingerprint import format_size

    listed = list(found.virtual_signs)
    if (
        found.working_set is not None
        and found.working_set < TINY_WORKING_SET
        and found.emulated is None
    ):
        listed.append(f"MPS working set {format_size(found.working_set)}")
    return listed


def small_memory(found: Fingerprint, virtual: bool) -> str | None:
    """Why ``--mps-empty-cache=auto`` empties the cache here, or None."""
    from pytest_mps.machine.fingerprint import format_size

    if virtual:
        return "the GPU is virtual"
    if found.working_set is not None and found.working_set < SMALL_WORKING_SET:
        return f"the MPS working set is {format_size(found.working_set)}, under 8 GiB"
    return None


def describe(found: list[str], chosen: str) -> str:
    """One header line for a virtual GPU and what the run does on it."""
    doing = {
        "run": "MPS tests run on it (--mps-virtual-gpu=run; skip or emulate instead)",
        "skip": "MPS tests skip (--mps-virtual-gpu=skip)",
        "emulate": "MPS tests run on the emulated device (--mps-virtual-gpu=emulate)",
    }[chosen]
    return f"virtual GPU ({'; '.join(found)}): {doing}"
