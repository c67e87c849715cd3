"""The mixed-device guard: ops whose tensor arguments live on several devices.

PyTorch accepts a 0-dim CPU tensor next to accelerator tensors (it is read as
a scalar: ``cuda_x * torch.tensor(2.0)``), silently on CUDA, but on MPS such
mixes crash or sync (pytorch#142048; nanochat PR #145 fixed exactly this).
The guard flags every op mixing CPU and non-CPU tensors, except the copies
whose job is to move data between devices. On by default under ``--mps``;
``--mps-mixed-devices`` (or its ini twin) and the ``no_mixed_devices`` marker
turn it on anywhere (CPU vs meta tensors show it on a machine without GPU).
"""

from __future__ import annotations

import sys
from collections.abc import Generator, Mapping
from functools import lru_cache
from typing import Any

import pytest

from pytest_mps.devices import devices_key
from pytest_mps.findings import TestFindings, describe, findings_for
from pytest_mps.options import argparse_type, choice
from pytest_mps.watch import OpCallback, user_location

MIXED_HELP = (
    "flag ops whose tensors live on more than one device (0-dim CPU tensors next "
    "to GPU tensors, pytorch#142048): 'error' fails the test, 'warn' reports, "
    "'off'. Default: error under --mps, off otherwise."
)
MODES = ("error", "warn", "off")

mode_key = pytest.StashKey[str]()


parse_mode = choice(MODES)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mps")
    group.addoption(
        "--mps-mixed-devices",
        dest="mps_mixed_devices",
        type=argparse_type(parse_mode, "--mps-mixed-devices"),
        metavar="{error,warn,off}",
        default=None,
        help=MIXED_HELP,
    )
    parser.addini("mps_mixed_devices", MIXED_HELP, default=None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "no_mixed_devices: fail the test if an op mixes tensors of several devices "
        "(e.g. a 0-dim CPU tensor with GPU tensors, pytorch#142048).",
    )
    value = config.getoption("mps_mixed_devices")
    if value is None:
        ini = config.getini("mps_mixed_devices")
        where = f"ini option mps_mixed_devices in {config.inipath}"
        try:
            value = parse_mode(str(ini), where) if ini else None
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
    if value is None:
        value = "error" if "mps" in config.stash.get(devices_key, []) else "off"
    config.stash[mode_key] = str(value)


@lru_cache(maxsize=1)
def exempt_ops() -> frozenset[Any]:
    """Ops that move data between devices on purpose."""
    import torch

    aten = torch.ops.aten
    ops = {
        aten._to_copy.default,
        aten.copy_.default,
        aten._copy_from.default,
        aten._copy_from_and_resize.default,
        aten.lift_fresh.default,
        aten.set_.source_Tensor,
    }
    # The fused attention backwards take the forward's philox seed and offset as
    # CPU tensors by design (native_functions.yaml: `Tensor philox_seed, Tensor
    # philox_offset`; attention_backward.cu reads them on the host). Not every
    # build has every one, so look them up by name.
    for name in (
        "_scaled_dot_product_efficient_attention_backward",
        "_efficient_attention_backward",
        "_scaled_dot_product_flash_attention_backward",
        "_flash_attention_backward",
        "_scaled_dot_product_cudnn_attention_backward",
    ):
        packet = getattr(aten, name, None)
        if packet is not None:
            ops.update(getattr(packet, o) for o in packet.overloads())
    return frozenset(ops)


def _describe_tensors(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    import torch

    parts: list[str] = []
    seen: set[str] = set()
    values = [*args, *kwargs.values()]
    flat = [b for a in values for b in (a if isinstance(a, (list, tuple)) else [a])]
    for t in flat:
        if not isinstance(t, torch.Tensor):
            continue
        label = f"{t.device}" + (" 0-dim" if t.dim() == 0 else f" {tuple(t.shape)}")
        if label not in seen:
            seen.add(label)
            parts.append(label)
    return ", ".join(parts)


def mixes_devices(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    """True when some tensor arguments are on the CPU and others are not.

    Looks at positional and keyword arguments and into lists and tuples of
    them (``torch.cat``, the foreach ops).
    """
    import torch

    tensor = torch.Tensor
    cpu = other = False
    for a in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(a, tensor):
            if a.is_cpu:
                cpu = True
            else:
                other = True
        elif type(a) is list or type(a) is tuple:
            for b in a:
                if isinstance(b, tensor):
                    if b.is_cpu:
                        cpu = True
                    else:
                        other = True
    return cpu and other


class DeviceGuard:
    """The per-op callback: records ops mixing CPU and non-CPU tensors."""

    #: a call whose tensors share a side cannot mix: skip clean calls (watch_front)
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
        if mixes_devices(args, kwargs) and id(func) not in self.exempt:
            where = user_location(sys._getframe(1))
            self.findings.add(
                "mixed-devices",
                func._schema.name,
                where,
                detail=_describe_tensors(args, kwargs),
            )


def _mode_for(item: pytest.Item) -> str:
    if item.get_closest_marker("no_mixed_devices") is not None:
        return "error"
    return item.config.stash.get(mode_key, "off")


def pytest_mps_watch_ops(item: pytest.Item) -> OpCallback | None:
    if _mode_for(item) == "off":
        return None
    return DeviceGuard(findings_for(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    result = yield
    if _mode_for(item) != "error":
        return result
    found = findings_for(item).of_kind("mixed-devices")
    if found:
        pytest.fail(
            f"{len(found)} op(s) mixed tensors of several devices (silently "
            "accepted on CPU/CUDA for 0-dim CPU tensors, a crash or sync on MPS, "
            "pytorch#142048):\n  " + "\n  ".join(describe(found, item.config.rootpath)),
            pytrace=False,
        )
    return result
